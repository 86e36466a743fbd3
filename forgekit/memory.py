"""How much memory this process used: a service at the bottom of the graph, for the compile report
(:mod:`forgekit.artifact.writer`) and ``forgekit bench``'s worker (:mod:`forgekit.evaluate.bench_worker`)."""

from __future__ import annotations

from pathlib import Path


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB.  VmHWM, not getrusage: ru_maxrss survives fork+exec, so a
    worker started by a big parent would report the parent's peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
