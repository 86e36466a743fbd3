"""Tuning: measure the schedule knobs of every heavy kernel on this machine and keep the best.

Why not a stock MetaSchedule search?  On two cores a few hundred MetaSchedule trials from naive loops
left conv nets 4-5x slower than onnxruntime (hours for more), while forgekit's default rules
(:mod:`forgekit.schedules`) are already close to it without measuring.  So tuning searches *around
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

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .errors import UsageError

ARTIFACT_RECORDS = "optimization_artifacts"


def default_records_dir() -> Path:
    """The shared records cache: ``$FORGEKIT_RECORDS``, else ``$XDG_CACHE_HOME/forgekit/records``."""
    if os.environ.get("FORGEKIT_RECORDS"):
        return Path(os.environ["FORGEKIT_RECORDS"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "forgekit" / "records"


def target_key(target: Any) -> str:
    """A folder name for a target: records measured for one CPU/core count never serve another."""
    data = json.dumps(_target_dict(target), sort_keys=True, default=str)
    kind = _target_dict(target).get("mcpu") or _target_dict(target).get("kind", "target")
    return f"{kind}-{hashlib.sha256(data.encode()).hexdigest()[:12]}"


def _target_dict(target: Any) -> dict[str, Any]:
    export = target.export() if hasattr(target, "export") else dict(target)
    return {k: v for k, v in dict(export).items() if k not in ("host", "tag", "keys") and not str(k).startswith("feature")}


# ----------------------------------------------------------------------------------- records
class Records:
    """Measured knob settings in a folder: ``records.jsonl``, one JSON line per measurement
    (``workload``, ``rule``, ``knobs``, ``seconds`` or null when the setting was invalid).

    Append-only, so concurrent runs sharing a cache only ever add lines, and a partial line from a
    killed run is skipped when reading.
    """

    FILE = "records.jsonl"

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.entries: list[dict[str, Any]] = []
        path = self.folder / self.FILE
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(entry, dict) and "workload" in entry and "knobs" in entry:
                    self.entries.append(entry)

    def add(self, entry: dict[str, Any]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / self.FILE, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry, sort_keys=True) + "\n")
        self.entries.append(entry)

    def tried(self, key: str) -> set[str]:
        return {_knob_key(e["knobs"]) for e in self.entries if e["workload"] == key}

    def best(self) -> dict[str, dict[str, Any]]:
        """workload -> the fastest valid entry."""
        out: dict[str, dict[str, Any]] = {}
        for e in self.entries:
            if not e.get("seconds"):
                continue
            if e["workload"] not in out or min(e["seconds"]) < min(out[e["workload"]]["seconds"]):
                out[e["workload"]] = e
        return out

    def __len__(self) -> int:
        return len(self.entries)


class RecordSet:
    """Best records across several folders (the artifact's and the shared cache), for the build."""

    def __init__(self, folders: list[Path]) -> None:
        self.best: dict[str, dict[str, Any]] = {}
        for folder in folders:
            for key, entry in Records(folder).best().items():
                if key not in self.best or min(entry["seconds"]) < min(self.best[key]["seconds"]):
                    self.best[key] = entry

    def __len__(self) -> int:
        return len(self.best)


def workload(func: Any) -> Any:
    """The PrimFunc as a one-function module named ``main`` (so the same kernel in another model,
    under another fused name, is the same workload)."""
    import tvm

    # A deep copy: TIR schedules update the functions they own in place, and the original is still
    # needed (the next candidate, the final build) — sharing it corrupted later candidates.
    fresh = tvm.ir.load_json(tvm.ir.save_json(func))
    return tvm.IRModule({"main": fresh.with_attr("global_symbol", "main")})


def workload_key(func: Any) -> str:
    import tvm_ffi

    return f"{int(tvm_ffi.structural_hash(workload(func))) & 0xFFFFFFFFFFFFFFFF:016x}"


def query_record(records: RecordSet, func: Any, target: Any) -> Any:
    """``func`` scheduled with its best measured knobs, or None when it has no record."""
    from tvm import s_tir

    from .schedules.rules import RULES
    from .schedules.target_info import target_info

    entry = records.best.get(workload_key(func))
    if entry is None:
        return None
    rule = next((r for r in RULES if r.name == entry["rule"]), None)
    if rule is None:
        return None
    tinfo = target_info(target)
    sch = s_tir.Schedule(workload(func))
    match = rule.matches(sch, tinfo)
    if match is None:
        return None
    rule.apply(sch, match, tinfo, entry["knobs"])
    name = func.attrs.get("global_symbol") if func.attrs is not None else None
    return sch.mod["main"].with_attr("global_symbol", name) if name is not None else sch.mod["main"]


# ----------------------------------------------------------------------------------- tasks
@dataclass
class Task:
    """One fused kernel with a knob space to measure."""

    name: str
    func: Any
    rule: Any
    calls: int
    macs: int
    key: str
    space: list[dict[str, Any]] = field(default_factory=list)

    @property
    def weight(self) -> int:
        return self.calls * self.macs


def _macs(sch: Any, block: Any) -> int:
    total = 1
    for loop in sch.get_loops(block):
        extent = sch.get(loop).extent
        total *= int(extent) if hasattr(extent, "value") or isinstance(extent, int) else 1
    return total


def _call_counts(mod: Any) -> dict[str, int]:
    from tvm import relax

    counts: dict[str, int] = {}

    def visit(expr: Any) -> None:
        if isinstance(expr, relax.Call):
            for arg in expr.args:
                if isinstance(arg, relax.GlobalVar):
                    counts[arg.name_hint] = counts.get(arg.name_hint, 0) + 1

    for _gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return counts


def extract_tasks(fused_mod: Any, target: Any) -> list[Task]:
    """Kernels of ``fused_mod`` whose rule has a knob space, heaviest (calls x MACs) first."""
    from tvm import s_tir, tirx

    from .schedules.rules import RULES
    from .schedules.target_info import target_info

    tinfo = target_info(target)
    counts = _call_counts(fused_mod)
    tasks: dict[str, Task] = {}
    for gv, func in fused_mod.functions_items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        for rule in RULES:
            sch = s_tir.Schedule(func)
            try:
                match = rule.matches(sch, tinfo)
            except Exception:  # a rule that cannot analyse the function does not match it
                match = None
            if match is None:
                continue
            if not hasattr(rule, "space"):
                break
            space = rule.space(sch, match, tinfo)
            if len(space) < 2:
                break
            key = workload_key(func)
            if key in tasks:  # the same kernel twice in the model: tune once
                tasks[key].calls += counts.get(gv.name_hint, 1)
                break
            tasks[key] = Task(gv.name_hint, func, rule, counts.get(gv.name_hint, 1), _macs(sch, match.block), key, space)
            break
    return sorted(tasks.values(), key=lambda t: -t.weight)


def _knob_key(knobs: dict[str, Any]) -> str:
    return json.dumps(knobs, sort_keys=True)


# ----------------------------------------------------------------------------------- measuring
def schedule_candidate(task: Task, knobs: dict[str, Any], target: Any) -> Any:
    """``task``'s kernel scheduled with ``knobs``, as a one-function module (``main``)."""
    from tvm import s_tir

    from .schedules.target_info import target_info

    tinfo = target_info(target)
    sch = s_tir.Schedule(workload(task.func), enable_check=False)
    match = task.rule.matches(sch, tinfo)
    task.rule.apply(sch, match, tinfo, knobs)
    return sch.mod


def random_args(mod: Any) -> list[Any]:
    """Seeded numpy arguments for the ``main`` PrimFunc of ``mod`` (floats normal, others zero)."""
    import numpy as np
    from tvm.s_tir import meta_schedule as ms

    rng = np.random.default_rng(0)
    args = []
    for info in ms.arg_info.ArgInfo.from_prim_func(mod["main"]):
        shape = [int(d) for d in info.shape]
        dtype = str(info.dtype)
        args.append(rng.standard_normal(shape).astype(dtype) if "float" in dtype else np.zeros(shape, dtype))
    return args


def _measure(task: Task, knobs: dict[str, Any], target: Any, number: int, repeat: int) -> list[float]:
    """Schedule ``task`` with ``knobs``, build it, time it here; returns the run seconds of each repeat.
    (:class:`forgekit.remote_tuning.RemoteMeasure` is the same over TVM RPC, on a board.)"""
    import tvm

    mod = schedule_candidate(task, knobs, target)
    lib = tvm.compile(mod, target=target)
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
    on this machine; :class:`forgekit.remote_tuning.RemoteMeasure` times it on a board over TVM RPC).
    A :class:`~forgekit.errors.ForgekitError` from it (a lost device) stops tuning; any other failure
    marks the setting invalid."""
    from .errors import ForgekitError

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
    done = 0
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
            except Exception:
                secs = None  # an invalid setting: recorded, never retried
            entry = {"workload": task.key, "kernel": task.name, "rule": task.rule.name, "knobs": knobs,
                     "seconds": secs, "macs": task.macs}
            for store in stores:
                store.add(entry)
            done += 1
            if secs:
                best[task.name] = min(best.get(task.name, min(secs)), min(secs))
                if knobs == task.space[0]:
                    default[task.name] = min(secs)
            if progress is not None:
                note = (f"{task.name}: {min(secs) * 1e3:.3f} ms, best {best[task.name] * 1e3:.3f} ms" if secs
                        else f"{task.name}: invalid setting")
                progress(done, total, note)
    improved = {k: default[k] / best[k] for k in best if k in default}
    return TuneSummary(len(tasks), done, time.perf_counter() - start, len(stores[0]), improved)
