"""Tuning: measure the schedule knobs of every heavy kernel on this machine and keep the best.

Why not a stock MetaSchedule search?  On two cores a few hundred MetaSchedule trials from naive loops
left conv nets 4-5x slower than onnxruntime (hours for more), while forgekit's default rules
(:mod:`forgekit.backends.cpu`) are already close to it without measuring.  So tuning searches *around
the rules*: each conv/matmul rule declares its knob space (vector tile, register tile, loop order:
``rule.space()``), and the tuner builds and times every candidate with TVM's own runtime
(``time_evaluator``, in-process, so there is no builder-worker start-up cost), best-first by the
kernel's share of the model's work.

Records are plain JSON lines (workload hash, rule, knobs, measured seconds), not MetaSchedule traces:
in TVM 0.27 a JSONDatabase could not replay the traces of these schedules when reloaded ("Check failed:
old_outputs.size() == new_outputs.size()"), while re-applying a rule with recorded knobs is exact and
cheap.  Two record folders are used:

* ``<output_path>/optimization_artifacts/`` — the artifact's own records (resumed when the same
  output is compiled again with ``force_overwrite``);
* a records cache shared across models and runs (default ``$XDG_CACHE_HOME/forgekit/records``,
  one sub-folder per target), so a kernel measured once is never measured again — the GitHub Action
  keeps it between CI runs.

``tuning_trials=N > 0`` measures up to N not-yet-measured candidates (a resumed run adds N more);
``N = 0`` only reuses the records.  Workloads are keyed by their structure (names normalized), so the
same conv shape in two models shares its records.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import CompileError, ForgekitError, UsageError
from .records import Records
from .tasks import Task, _knob_key, extract_tasks, random_args, schedule_candidate


def _measure(task: Task, knobs: dict[str, Any], target: Any, number: int, repeat: int) -> list[float]:
    """Schedule ``task`` with ``knobs``, build it, time it here; returns the run seconds of each repeat.
    (:class:`forgekit.tuning.remote.RemoteMeasure` is the same over TVM RPC, on a board.)"""
    import tvm

    from ..backends.cpu import stack_tiles

    mod = schedule_candidate(task, knobs, target)
    lib = tvm.compile(mod, target=target, tir_pipeline=stack_tiles.tir_pipeline())
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in random_args(mod)]
    timer = lib.mod.time_evaluator("main", dev, number=number, repeat=repeat, min_repeat_ms=20)
    return [float(r) for r in timer(*args).results]


@dataclass
class TuneSummary:
    """What a tuning run did (written to compile_report.json)."""

    tasks: int
    trials: int
    seconds: float
    records: int
    improved: dict[str, float] = field(default_factory=dict)  # task -> default time / best time

    def to_dict(self) -> dict[str, Any]:
        return {"tasks": self.tasks, "trials": self.trials, "seconds": round(self.seconds, 1),
                "records": self.records, "speedup_per_task": {k: round(v, 3) for k, v in self.improved.items()}}


def tune(fused_mod: Any, target: Any, trials: int, folders: list[Path], *,
         progress: Callable[[int, int, str], None] | None = None,
         measure: Callable[..., list[float]] | None = None) -> TuneSummary:
    """Measure up to ``trials`` not-yet-measured knob settings over the kernels of ``fused_mod``;
    every measurement is appended to the records of every folder in ``folders``.

    ``measure(task, knobs, target, number=, repeat=)`` times one candidate (default: build and time it
    on this machine; :class:`forgekit.tuning.remote.RemoteMeasure` times it on a board over TVM RPC).
    A :class:`~forgekit.errors.ForgekitError` from it (a lost device) stops tuning; any other failure
    marks the setting invalid."""
    measure = measure or _measure
    if trials < 0:
        raise UsageError(f"tuning trials must be >= 0, got {trials}.")
    start = time.perf_counter()
    stores = [Records(f) for f in folders]
    tasks = extract_tasks(fused_mod, target)
    tried = {t.key: set().union(*(s.tried(t.key) for s in stores)) for t in tasks}
    queues = {t.key: [k for k in t.space if _knob_key(k) not in tried[t.key]] for t in tasks}
    best: dict[str, float] = {}
    default: dict[str, float] = {}
    done = valid = 0
    first_error = ""
    total = min(trials, sum(len(q) for q in queues.values()))
    # Round-robin in weight order: every heavy kernel gets its default and best guesses measured
    # before any kernel gets its long tail.
    while done < trials and any(queues.values()):
        for task in tasks:
            if done >= trials or not queues[task.key]:
                continue
            knobs = queues[task.key].pop(0)
            try:
                secs: list[float] | None = measure(task, knobs, target, number=3, repeat=3)
            except ForgekitError:
                raise
            except Exception as exc:  # noqa: BLE001 - an invalid setting: recorded, never retried
                secs = None
                first_error = first_error or (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
            entry = {"workload": task.key, "kernel": task.name, "rule": task.rule.name, "knobs": knobs,
                     "seconds": secs, "macs": task.macs}
            for store in stores:
                store.add(entry)
            done += 1
            if secs:
                valid += 1
                best[task.name] = min(best.get(task.name, min(secs)), min(secs))
                if knobs == task.space[0]:
                    default[task.name] = min(secs)
            if progress is not None:
                note = (f"{task.name}: {min(secs) * 1e3:.3f} ms, best {best[task.name] * 1e3:.3f} ms" if secs
                        else f"{task.name}: invalid setting")
                progress(done, total, note)
    if done and not valid:
        # the user asked for measurements and got none: a build with default schedules would hide it
        raise CompileError(f"Tuning failed: all {done} trials were invalid (first error: {first_error}); "
                           "compile without --tune-trials, or check that this machine can run the target's code.")
    improved = {k: default[k] / best[k] for k in best if k in default}
    return TuneSummary(len(tasks), done, time.perf_counter() - start, len(stores[0]), improved)
