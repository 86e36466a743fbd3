"""The pass that applies the rule registry to every PrimFunc of an IRModule."""
import logging
import os

import tvm
from tvm import s_tir, tirx
from tvm.ir.transform import module_pass
from tvm.target import Target

from .rules import RULES
from .target_info import target_info

log = logging.getLogger("forgekit.schedules")
STATS = {}  # func name -> rule name (last run), for reports / debugging


@module_pass(opt_level=0, name="forgekit.ApplyScheduleRules")
class ApplyRules:
    def __init__(self, target=None, rules=None, database=None):
        self.target = target
        self.rules = list(rules) if rules is not None else RULES
        # Tuning records (a MetaSchedule Database, see forgekit.tuning): a kernel with a record is
        # scheduled by replaying the best measured trace instead of the default rule.
        self.database = database

    def transform_module(self, mod, _ctx):
        target = self.target or Target.current(allow_none=False)
        tinfo = target_info(target)
        updates = {}
        debug = os.environ.get("FORGEKIT_SCHED_DEBUG")
        for gv, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc):
                continue
            if func.attrs is not None and func.attrs.get("tirx.is_scheduled", False):
                continue
            if self.database is not None:
                from ..tuning import query_record

                tuned = query_record(self.database, func, target)
                if tuned is not None:
                    STATS[gv.name_hint] = "tuned"
                    updates[gv] = tuned.with_attr("tirx.is_scheduled", True)
                    continue
            for rule in self.rules:
                # A fresh copy per attempt: schedule primitives may update the function in place, and a
                # rule that fails half-way must not leave the next rule a half-scheduled function.
                sch = s_tir.Schedule(tvm.ir.load_json(tvm.ir.save_json(func)))
                try:
                    m = rule.matches(sch, tinfo)
                    if m is None:
                        continue
                    rule.apply(sch, m, tinfo)
                except Exception as e:  # pylint: disable=broad-except
                    if debug:
                        print(f"[forgekit.schedules] {gv.name_hint}: rule {rule.name} failed: {e}")
                        if debug == "2":
                            import traceback; traceback.print_exc()
                    continue
                STATS[gv.name_hint] = rule.name
                if debug:
                    print(f"[forgekit.schedules] {gv.name_hint}: {rule.name}")
                updates[gv] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
                break
        mod = mod.clone()  # never mutate the caller's module
        for gv, f in updates.items():
            mod[gv] = f
        return mod
