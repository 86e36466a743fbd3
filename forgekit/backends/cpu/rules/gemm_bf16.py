"""bf16 conv2d/matmul rule: the dot-product micro-kernel (:mod:`.dot_tile`) with ``vdpbf16ps`` (see :mod:`..bf16`).

Matches the blocks made by :mod:`..bf16` (``conv2d_nhwc_bf16`` / ``matmul_bf16``): spatial ``[..., r, v]``
and reduction ``[..., c, i]`` with ``i`` the bf16 pair of one lane.  Schedule::

    parallel for (<other spatial>, r_o, v_o):           # carries pragma_import_llvm: forgekit_dpbf16ps
                                                        # (v_o outermost when the weights are big)
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
from .common import MIN_PARALLEL_ELEMS, SYMBOLIC_GUESS, ext
from .dot_tile import DotTileRule

if TYPE_CHECKING:
    from ....targets.isa import IsaInfo

BLOCKS = ("conv2d_nhwc_bf16", "matmul_bf16")

#: packed bf16 weights up to this size are swept once per pixel tile (:func:`channels_inner`): half the
#: 1 MiB L2 of a Zen 4 core (Sapphire Rapids has 2 MiB)
INNER_WEIGHT_BYTES = 512 * 1024


def channels_inner(sch: Schedule, spatial: list, reduction: list) -> bool:
    """Whether the fused tile loop runs the output-channel blocks innermost (pixel tiles outer).

    The shared :class:`DotTileRule` (whose hook this is) runs a channel block over every pixel (its weights stay in cache while
    the input streams past).  When all the weights fit in L2 the other order wins: a pixel tile's input
    stays in L1 across the channel blocks and its output is written contiguously, where each thread
    otherwise wrote every pixel's half of the channels.  Measured on this Zen 4 (2 threads, one process,
    alternating, min of 12): PP-OCRv4 det's 1x1 convs at 160x160, 24->96 channels 1.41 -> 0.78 ms and
    12->96 1.28 -> 0.90 ms; ResNet-50's 1x1 convs with a residual 0.82-0.91x; the 4.5 MiB-weight convs of
    ResNet-50's last stage 1.09-1.10x slower that way, so they keep the channel-outer order."""
    red = 1
    for l in reduction:
        red *= ext(sch, l) or SYMBOLIC_GUESS
    ev = ext(sch, spatial[-1]) or SYMBOLIC_GUESS
    return ev * red * 2 <= INNER_WEIGHT_BYTES  # bf16 weights: 2 bytes each of [channels, reduction]


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

    def channels_inner(self, sch: Schedule, spatial: list, reduction: list) -> bool:
        return channels_inner(sch, spatial, reduction)
