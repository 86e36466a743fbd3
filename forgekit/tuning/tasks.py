"""Tuning tasks: the fused kernels whose schedule rule declares a knob space, heaviest first, and how one
candidate setting is scheduled."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .records import _knob_key, workload, workload_key  # noqa: F401 - _knob_key: the tuner's too


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

    from ..backends.cpu.rules import RULES
    from ..targets.isa import isa_info

    tinfo = isa_info(target)
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



def schedule_candidate(task: Task, knobs: dict[str, Any], target: Any) -> Any:
    """``task``'s kernel scheduled with ``knobs``, as a one-function module (``main``)."""
    from tvm import s_tir

    from ..targets.isa import isa_info

    tinfo = isa_info(target)
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
