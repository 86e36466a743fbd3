"""conv2d rule (NHWC data, HWIO kernel after relax_passes.to_nhwc).

Covers regular, 1x1, strided, grouped and depthwise convolutions: the reduction block
``conv2d_nhwc`` / ``group_conv2d_nhwc`` / ``depth_conv2d_nhwc`` is a MAC whose output index is
[n, oh, ow, oc]; vectorize over oc (weights are HWIO so oc is contiguous), register-tile over ow,
keep the bias/relu/residual epilogue fused per tile.  Padding is its own parallel loop nest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tvm.s_tir import Schedule

from . import tiled
from .base import ScheduleRule
from .tiled import GemmLike

if TYPE_CHECKING:
    from ....targets.isa import IsaInfo


class Conv2DRule(ScheduleRule):
    name = "conv2d"

    def matches(self, sch: Schedule, tinfo: IsaInfo) -> GemmLike | None:
        g = tiled.analyze(sch, tinfo)
        if g is None:
            return None
        name = sch.get(g.block).name_hint
        if "conv" not in name:
            return None
        return g

    def space(self, sch: Schedule, g: GemmLike, tinfo: IsaInfo) -> list[dict[str, Any]]:
        """Knob settings to measure when tuning (the default first)."""
        return tiled.tile_space(sch, g, tinfo)

    def apply(self, sch: Schedule, g: GemmLike, tinfo: IsaInfo, knobs: dict[str, Any] | None = None) -> Schedule:
        return tiled.schedule_gemm_like(sch, g, tinfo, knobs)
