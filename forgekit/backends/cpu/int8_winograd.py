"""Integer 3x3 stride-1 convolutions as Winograd transforms, for CPUs without a 4-byte integer dot product.

Where the integer kernel multiplies 2 bytes per lane (AVX2's ``vpmaddwd`` and the ``vpaddd`` after it: 1.2x
an FMA's multiply-adds on a Zen 3, measured) or there is none (Cortex-A72, SSE-only x86: generic integer
code), direct int8 convolutions lose to fp32's Winograd ones: int8 ResNet-18 ran at 0.78x its fp32's speed on
a Zen 3 (issue 39: int8 must never lose to fp32).  Two routes (:func:`emit_conv`):

* **fp32 F(4x4, 3x3)** on the integer values (:mod:`.winograd`'s own kernels; the sums rounded back to int32,
  carrying fp32 Winograd's rounding, 4e-6 of their size: far below the quantization's step), where fp32 takes
  F(4x4) and its U stays in a core's L2 (:data:`F4_MAX_WEIGHT_BYTES`), or there is no int16 kernel;
* **integer F(2x2, 3x3)** on ``vpmaddwd`` (:func:`int16_gemm`): B^T's 0/+-1 keep V exact in int16, G's halves
  scaled by 4 keep U integer, M exact in int32 — the result is exact to the unit like the direct kernel's, with
  2.25x fewer multiplies and U in int16 (16/9 the int16 weights: fp32 F(4x4)'s U is 8x them).

Measured on a Zen 3 (2 threads, ms per conv; fp32 F(4x4) / int16 F(2x2) / direct ``vpmaddwd``): 56x56
64->64 0.97 / 1.05 / 2.2, 80x80 32->32 0.72 / 0.90 / 1.16, 28x28 128->128 1.06 / 0.86 / 2.1, 40x40 128->128
2.04 / 1.98 / 3.3, 20x20 96->192 1.42 / 0.52 / 1.26, 14x14 256->256 (F(2x2) sizes) - / 1.02 / 2.07, 7x7
512->512 - / 1.48 / 1.87.  An fp32 F(2x2) route for the smaller images instead was 5% faster than ``vpmaddwd``
alone and made the artifact 3.3x larger (7c5713d).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from tvm import relax, tirx

from . import winograd
from .packed_conv import _const_value, _int_or_expr, conv_geometry

if TYPE_CHECKING:
    from ...targets.isa import IsaInfo

#: fp32 F(4x4)'s U up to this size (36/9 = 4x the weights, 4 bytes each: 64 -> 64 channels take 590 KB, 128 ->
#: 128 2.4 MB); above it the int16 F(2x2) GEMM wins (its U 4.5x smaller: the weights stream from L3)
F4_MAX_WEIGHT_BYTES = 1 << 20
#: |V| <= 4 * 255 and |4U| <= 9 * 128, so M's int32 sums hold this many input channels (1020 * 1152 * C < 2^31)
INT16_MAX_CHANNELS = 1827


def emit_conv(bb: Any, call: Any, tinfo: IsaInfo, kernel: Any) -> Any | None:
    """The int32 result of the integer conv2d ``call`` (NHWC/HWIO, constant int8 weights) by one of the routes
    above, or None where Winograd does not apply (or a direct kernel wins).  ``kernel``: the target's
    :class:`~.int8.DotKernel` (None: no integer dot product)."""
    a = call.attrs
    data, weight = call.args
    if a.data_layout != "NHWC" or a.kernel_layout != "HWIO" or a.out_layout != "NHWC" or data.ty.shape is None:
        return None
    n, h, wd, ic = (_int_or_expr(v) for v in data.ty.shape.values)
    w = _const_value(weight).astype(np.float32)
    # 32 input channels at least, on every CPU: at 16 the integer direct kernel won as often as it lost on a Zen 3
    # (16 -> 16 at 160x160 0.733 against 1.107 ms, 16 -> 64 at 55x55 0.518 against 0.326)
    if not isinstance(ic, int) or not winograd.applies(a, w, (n, h, wd, ic), tinfo.vec_lanes, winograd.MIN_CHANNELS):
        return None
    (_, _), (dh, _), (pt, pl, _, _), (oh, ow) = conv_geometry(a, h, wd, 3, 3)
    if not isinstance(oh, int) or not isinstance(ow, int):
        _, oh, ow, _ = (_int_or_expr(v) for v in call.ty.shape.values)  # as the fp32 conv takes them
    oc = w.shape[3]
    shapes = ((n, h, wd, ic), (n, oh, ow, oc))
    # a symbolic batch takes the integer GEMM too (exact; 64 -> 64 channels at 12x12 on a Zen 3: 0.054 against
    # the direct kernel's 0.085 ms); a symbolic image the fp32 F(4x4) (:func:`winograd.choose` counts its sides
    # as large; the integer GEMM took 0.65-1.3x its time there)
    int16 = (kernel is not None and kernel.data_dtype == "int16" and ic % kernel.red == 0
             and ic <= INT16_MAX_CHANNELS and isinstance(h, int) and isinstance(wd, int))
    f4_u_bytes = winograd.F4.alpha ** 2 * ic * oc * 4  # as winograd.choose sizes it
    if winograd.choose(shapes[1], ic) is winograd.F4 and (not int16 or f4_u_bytes <= F4_MAX_WEIGHT_BYTES):
        out = winograd.emit(bb, data, w, *shapes, tinfo, winograd.F4, load=lambda v: v.astype("float32"),
                            dilation=dh, pad=(pt, pl))
    elif int16:
        out = winograd.emit(bb, data, w, *shapes, tinfo, winograd.F2,
                            lambda e, c, k, t: int16_gemm(e, c, k, t, kernel), load=lambda v: v.astype("int16"),
                            dilation=dh, pad=(pt, pl))
    else:
        return None
    return relax.op.astype(relax.op.round(bb.emit(out)), "int32")


def int16_gemm(e: int, c: int, k: int, tiles: int, kernel: Any) -> winograd.Gemm:
    """F(2x2, 3x3)'s ``e`` GEMMs on ``kernel``'s int16 pairs (``vpmaddwd``; a :data:`.winograd.GemmFactory` once
    ``kernel`` is bound): V int16 as the input transform computes it, U scaled by 4 into integers and packed
    ``[E, K/L, C/2, L, 2]`` like the direct kernel's weights (the block is ``matmul_int8``: the int8 rule
    tensorizes it), M int32, divided by 4 as the output transform reads it in fp32 (exact below 2^24, above it
    rounded to 6e-8 of its size)."""
    def elements(u: np.ndarray) -> np.ndarray:
        return np.rint(u.astype(np.float64) * 4).astype(np.int16)  # multiples of 1/4, at most 9 * 128: exact

    return winograd.pair_gemm(e, c, k, tiles, kernel.red, kernel.lanes, elements, lambda v: v.astype("int32"),
                              "matmul_int8", result=lambda m: m.astype("float32") * tirx.const(0.25, "float32"))
