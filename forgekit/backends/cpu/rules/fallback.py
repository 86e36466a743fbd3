"""Fallback for anything no other rule claimed: inline what can be inlined, then parallelize the
outer loops and vectorize the inner loop of each remaining block independently.  Never makes the
naive code slower, and keeps every function at least multi-threaded."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tvm.s_tir import Schedule

from .base import ScheduleRule
from .common import (
    blocks_of,
    ext,
    is_output_block,
    is_reduction,
    iter_kinds,
    parallel_spatial,
    try_inline,
)

if TYPE_CHECKING:
    from ....targets.isa import IsaInfo


class FallbackRule(ScheduleRule):
    name = "fallback"

    def matches(self, sch: Schedule, tinfo: IsaInfo) -> bool:
        return True

    def apply(self, sch: Schedule, _m: Any, tinfo: IsaInfo, knobs: dict[str, Any] | None = None) -> Schedule:
        for b in blocks_of(sch):
            if not is_reduction(sch, b) and not is_output_block(sch, b):
                try_inline(sch, b)
        for b in blocks_of(sch):
            if not is_reduction(sch, b):
                parallel_spatial(sch, b, tinfo.vec_lanes)
                continue
            k = iter_kinds(sch, b)
            loops = sch.get_loops(b)
            lead = []
            for kk, l in zip(k, loops):
                if kk != "S":
                    break
                lead.append(l)
            if lead:
                f = sch.fuse(*lead) if len(lead) > 1 else lead[0]
                if ext(sch, f) is None or ext(sch, f) > 1:
                    sch.parallel(f)
        return sch
