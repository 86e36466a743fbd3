"""Injective functions (elementwise, broadcast, transpose/reshape, concat, layout transforms):
inline everything into the output block(s), fuse loops, vectorize the innermost lanes and
parallelize the rest."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV

from .base import ScheduleRule
from .common import (
    blocks_of,
    is_output_block,
    is_reduction,
    parallel_spatial,
    try_inline,
)

if TYPE_CHECKING:
    from ....targets.isa import IsaInfo


class ElementwiseRule(ScheduleRule):
    name = "elementwise"

    def matches(self, sch: Schedule, tinfo: IsaInfo) -> list[SBlockRV] | None:
        blocks = blocks_of(sch)
        if any(is_reduction(sch, b) for b in blocks):
            return None
        return blocks

    def apply(self, sch: Schedule, blocks: list[SBlockRV], tinfo: IsaInfo, knobs: dict[str, Any] | None = None) -> Schedule:
        for b in blocks:
            if not is_output_block(sch, b):
                try_inline(sch, b)
        for b in blocks_of(sch):
            parallel_spatial(sch, b, tinfo.vec_lanes)
        return sch
