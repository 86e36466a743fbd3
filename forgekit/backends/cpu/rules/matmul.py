"""dense / matmul / batch_matmul rule.

Any remaining MAC reduction whose output's last index is a spatial iterator: ONNX MatMul / Gemm
(weights are folded to [K, N] so N is contiguous), batched attention matmuls ([B, H, S, D]).  Same
register-tiled micro-kernel as conv2d: vectorize N, register-tile M, parallel over
(N tiles, batch, M tiles), fused epilogue (bias, gelu, scaling, residual add).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tvm.s_tir import Schedule

from . import tiled
from .base import ScheduleRule
from .tiled import GemmLike

if TYPE_CHECKING:
    from ....targets.isa import IsaInfo


class MatmulRule(ScheduleRule):
    name = "matmul"

    def matches(self, sch: Schedule, tinfo: IsaInfo) -> GemmLike | None:
        g = tiled.analyze(sch, tinfo)
        if g is not None:
            g.streaming = tiled.streams_weights(sch, g)
        return g

    def space(self, sch: Schedule, g: GemmLike, tinfo: IsaInfo) -> list[dict[str, Any]]:
        """Knob settings to measure when tuning (the default first)."""
        return tiled.tile_space(sch, g, tinfo)

    def apply(self, sch: Schedule, g: GemmLike, tinfo: IsaInfo, knobs: dict[str, Any] | None = None) -> Schedule:
        return tiled.schedule_gemm_like(sch, g, tinfo, knobs)
