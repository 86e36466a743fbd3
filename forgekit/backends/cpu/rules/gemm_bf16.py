"""bf16 conv2d/matmul rule: the dot-product micro-kernel (:mod:`.dot_tile`) with ``vdpbf16ps`` (see :mod:`..bf16`).

Matches the blocks made by :mod:`..bf16` (``conv2d_nhwc_bf16`` / ``matmul_bf16``): spatial ``[..., r, v]``
and reduction ``[..., c, i]`` with ``i`` the bf16 pair of one lane.  Schedule::

    parallel for (v_o, <other spatial>, r_o):           # carries pragma_import_llvm: forgekit_dpbf16ps
        acc[rt][16 nv] = 0                              # fp32, on the stack -> zmm registers
        for <reductions except i>:
            for r_i in unroll(rt): for v_n in unroll(nv):
                acc[r_i][v_n] = vdpbf16ps(acc[r_i][v_n], bcast(x[2 bf16]), w[32 bf16])
        fp32 epilogue (channel slice, bias, relu, ...)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tvm.s_tir import Schedule

from .. import bf16
from .common import MIN_PARALLEL_ELEMS, ext
from .dot_tile import DotTileRule

if TYPE_CHECKING:
    from ....targets.isa import IsaInfo

BLOCKS = ("conv2d_nhwc_bf16", "matmul_bf16")


def _parallel_ok(sch: Schedule, spatial: list, reduction: list) -> bool:
    """Whether the tile loop may be parallel.  With a symbolic (batch) axis, only when one sample's tile nest
    is never small: :mod:`..serial_when_small` twins a small-able parallel nest with a serial copy that shares
    the tensorized blocks' match buffers, which TVM's lowering rejects ("buffer match constraint ... unmet").
    The instruction count per sample bounds the work that pass counts from below."""
    if all(ext(sch, l) is not None for l in spatial):
        return True
    calls = 1
    for l in [*spatial[:-1], *reduction[:-1]]:
        calls *= ext(sch, l) or 1
    return calls * (ext(sch, spatial[-1]) // bf16.LANES) >= MIN_PARALLEL_ELEMS


class GemmBf16Rule(DotTileRule):
    """The bf16 micro-kernel; matches only on targets with AVX512_BF16 (the legalization packed the weights
    for it, and only there)."""

    name = "gemm_bf16"
    blocks = BLOCKS
    lanes = bf16.LANES
    red = bf16.RED
    what = "bf16 pair"

    def available(self, tinfo: IsaInfo) -> bool:
        return bf16.has_bf16(tinfo)

    def intrinsic(self) -> str:
        return bf16.register_intrin()

    def may_parallel(self, sch: Schedule, spatial: list, reduction: list) -> bool:
        return _parallel_ok(sch, spatial, reduction)

    def annotate(self, sch: Schedule, outer: Any) -> None:
        # the LLVM function the intrinsic calls: parsed, linked and inlined by the LLVM codegen
        sch.annotate(outer, "pragma_import_llvm", bf16.LLVM_IR)
