"""The thread pool under CPU contention (issue 39, point 5): what the runtime establishes, not timings.

TVM binds each pool worker to one core by default and its parallel kernels wait for every worker's static
chunk; with two busy processes on a 2-core machine a ResNet-style model took 260-380 ms instead of 6 ms
(onnxruntime 55-100 ms).  The runtime leaves the workers unbound (loader.BIND_THREADS) and sizes the pool of
the calling thread to the cores free at each inference (loader.fit_threads_to_load).  bench/bench_contention.py
times it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from forgekit.runtime import loader

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: /proc, sched_setaffinity")

_PROBE = r'''
import glob, json, os, sys
import numpy as np
from forgekit.runtime import Engine, loader
engine = Engine(sys.argv[1])
x = np.random.default_rng(0).standard_normal(engine.input_shapes[0]).astype(np.float32)
out = None
for _ in range(3):
    out = engine.infer(x)[0]
np.save(sys.argv[2], out)
me = os.getpid()
allowed = {}
for task in glob.glob(f"/proc/{me}/task/*"):
    line = [l for l in open(task + "/status").read().splitlines() if l.startswith("Cpus_allowed_list")][0]
    allowed[os.path.basename(task)] = line.split()[-1]
print(json.dumps({"bind": os.environ.get("TVM_BIND_THREADS"), "pool": loader.pool_threads(),
                  "process": ",".join(map(str, sorted(os.sched_getaffinity(0)))), "threads": allowed}))
'''


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    import forgekit as forge
    from test_weights import _cnn

    return forge.from_onnx(_cnn(0)).compile(target="host", output_path=tmp_path_factory.mktemp("c") / "a").path


def _probe(artifact, out, **env_changes) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TVM_BIND_THREADS", "FORGEKIT_ADAPTIVE_THREADS", "OMP_NUM_THREADS")}
    env["TVM_NUM_THREADS"] = "2"
    env.update(env_changes)
    res = subprocess.run([sys.executable, "-c", _PROBE, str(artifact), str(out)], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def _cpu_list(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


@linux
def test_workers_are_not_pinned_to_a_core(artifact, tmp_path) -> None:
    """TVM pins worker i to core i+1 unless TVM_BIND_THREADS says otherwise: such a worker cannot leave a core a
    busy process holds, and every kernel waits for it.  The runtime sets TVM_BIND_THREADS=0 unless the user set
    it (then TVM's binding is theirs)."""
    ours = _probe(artifact, tmp_path / "a.npy", FORGEKIT_ADAPTIVE_THREADS="0")
    assert ours["bind"] == loader.BIND_THREADS == "0"
    process = _cpu_list(ours["process"])
    assert len(ours["threads"]) >= 2, ours  # the calling thread and a worker at least
    assert all(_cpu_list(c) == process for c in ours["threads"].values()), ours
    if len(process) >= 2:  # the probe tells a pinned worker apart
        theirs = _probe(artifact, tmp_path / "b.npy", FORGEKIT_ADAPTIVE_THREADS="0", TVM_BIND_THREADS="1")
        assert theirs["bind"] == "1"
        assert any(len(_cpu_list(c)) == 1 for c in theirs["threads"].values()), theirs


@linux
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 if hasattr(os, "sched_getaffinity") else True,
                    reason="needs 2 CPUs")
def test_the_pool_shrinks_when_other_processes_hold_the_cores(artifact, tmp_path) -> None:
    """With as many busy processes as CPUs, each inference runs on the calling thread alone (a barrier waiting
    for a descheduled worker took 40x longer), with the same outputs; FORGEKIT_ADAPTIVE_THREADS=0 keeps the pool."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in os.sched_getaffinity(0)]
    try:
        loaded = _probe(artifact, tmp_path / "loaded.npy")
        fixed = _probe(artifact, tmp_path / "fixed.npy", FORGEKIT_ADAPTIVE_THREADS="0")
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert loaded["pool"] == 1, loaded
    assert fixed["pool"] is None, fixed
    np.testing.assert_allclose(np.load(tmp_path / "loaded.npy"), np.load(tmp_path / "fixed.npy"), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("running, current, expected", [
    (2, 2, 2),   # only this inference's threads run: all of the pool
    (1, 1, 2),   # the calling thread alone (its workers asleep): all of the pool
    (3, 2, 1),   # one other task on 2 CPUs: one thread
    (4, 2, 1),   # two busy processes
    (9, 1, 1),   # never fewer than one
    (3, 1, 1),
])
def test_threads_for_the_load(tmp_path, running, current, expected) -> None:
    path = tmp_path / "loadavg"
    path.write_text(f"3.10 2.50 2.00 {running}/120 4242\n")
    probe = loader._LoadProbe.__new__(loader._LoadProbe)
    probe.fd, probe.limit, probe.cpus, probe.scale, probe.enabled = os.open(path, os.O_RDONLY), 2, 2, 1.0, True
    try:
        assert probe.threads(current) == expected
    finally:
        os.close(probe.fd)


def test_a_cpuset_counts_its_share_of_the_machine(tmp_path) -> None:
    """/proc/loadavg counts the whole machine: 10 runnable tasks on 64 CPUs leave 2 of them mostly free."""
    path = tmp_path / "loadavg"
    path.write_text("9.0 9.0 9.0 12/900 4242\n")
    probe = loader._LoadProbe.__new__(loader._LoadProbe)
    probe.fd, probe.limit, probe.cpus, probe.scale, probe.enabled = os.open(path, os.O_RDONLY), 2, 2, 2 / 64, True
    try:
        assert probe.threads(2) == 2
    finally:
        os.close(probe.fd)
