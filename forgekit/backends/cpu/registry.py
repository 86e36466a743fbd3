"""The pass that applies the rule registry to every PrimFunc of an IRModule."""

from __future__ import annotations

import logging
from typing import Any, Protocol, Sequence

import tvm
from tvm import s_tir, tirx
from tvm.ir.transform import module_pass
from tvm.target import Target
from tvm_ffi.serialization import from_json_graph_str, to_json_graph_str

from ... import progress
from ...targets.isa import isa_info
from .bf16_activations import inline_widening
from .rules import RULES
from .rules.base import ScheduleRule

log = logging.getLogger("forgekit.schedules")
#: fused function name -> rule that scheduled it (last run), for compile reports
STATS: dict[str, str] = {}
#: fused function name -> floating-point operations of one call (static shapes only; last run), so a
#: profile can print GFLOP/s per kernel (compile_report.json "kernel_flops")
FLOPS: dict[str, float] = {}


def _flops(func: tirx.PrimFunc) -> float | None:
    """TVM's estimate of one call's floating-point operations, None where it cannot tell (symbolic shapes)."""
    try:
        value = float(s_tir.analysis.estimate_tir_flops(tvm.IRModule({"main": func})))
    except Exception:  # noqa: BLE001 - TVM raises for loops of unknown extent
        return None
    return value if value > 0 else None


class RecordQuery(Protocol):
    """Tuning records (:class:`forgekit.tuning.RecordSet`): a kernel with a record is scheduled by
    re-applying its best measured knobs instead of the default rule."""

    def query(self, func: Any, target: Any) -> Any: ...


@module_pass(opt_level=0, name="forgekit.ApplyScheduleRules")
class ApplyRules:
    """Schedule every unscheduled PrimFunc with the first rule that matches it (``FORGEKIT_SCHED_DEBUG=1``
    logs each choice, and each failing rule's error, on the ``forgekit.schedules`` logger)."""

    def __init__(self, target: Target | None = None, rules: Sequence[ScheduleRule] | None = None,
                 database: RecordQuery | None = None) -> None:
        self.target = target
        self.rules = list(rules) if rules is not None else RULES
        self.database = database

    def transform_module(self, mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        target = self.target or Target.current(allow_none=False)
        isa = isa_info(target)
        updates = {}
        todo = [(gv, func) for gv, func in mod.functions_items() if isinstance(func, tirx.PrimFunc)
                and not (func.attrs is not None and func.attrs.get("tirx.is_scheduled", False))]
        for done, (gv, func) in enumerate(todo):
            progress.report("scheduling kernels", done, len(todo))
            flops = _flops(func)
            if flops is not None:
                FLOPS[gv.name_hint] = flops
            if self.database is not None:
                tuned = self.database.query(func, target)
                if tuned is not None:
                    STATS[gv.name_hint] = "tuned"
                    updates[gv] = tuned.with_attr("tirx.is_scheduled", True)
                    continue
            scheduled = self._schedule(gv.name_hint, func, isa)
            if scheduled is not None:
                updates[gv] = scheduled
        mod = mod.clone()  # never mutate the caller's module
        for gv, f in updates.items():
            mod[gv] = f
        return mod

    def _schedule(self, name: str, func: tirx.PrimFunc, isa: Any) -> tirx.PrimFunc | None:
        # A fresh copy per attempt: schedule primitives may update the function in place, and a rule that
        # fails half-way must not leave the next rule a half-scheduled function.  Serialized once and read
        # back by tvm_ffi itself: tvm.ir.load_json first upgrades old-version JSON in Python (json.loads and
        # dumps of the whole graph), 38 of the 53 s of scheduling PP-OCRv6 det's 324 kernels x 3 levels.
        text = to_json_graph_str(func)
        for rule in self.rules:
            sch = s_tir.Schedule(from_json_graph_str(text))
            try:
                inline_widening(sch)
                match = rule.matches(sch, isa)
                if match is None:
                    continue
                rule.apply(sch, match, isa)
            except Exception as exc:  # noqa: BLE001 - a rule that cannot handle a kernel: try the next one
                log.debug("%s: rule %s failed: %s", name, rule.name, exc, exc_info=log.isEnabledFor(logging.DEBUG - 1))
                continue
            STATS[name] = rule.name
            log.debug("%s: %s", name, rule.name)
            return sch.mod["main"].with_attr("tirx.is_scheduled", True)
        return None
