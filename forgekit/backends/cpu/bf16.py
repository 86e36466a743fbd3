"""bf16 conv2d/matmul for x86 CPUs with AVX512_BF16 (``precision="bfloat16"``): weights and activations
rounded to bf16, products summed in fp32 by ``vdpbf16ps`` (16 fp32 lanes, each += 2 bf16 x bf16 products:
2x the multiply-adds of an fp32 FMA), everything else (bias, activations, pooling, softmax...) in fp32.

How the instruction is reached from TVM 0.27, which has no usable bf16 type on CPUs:

* TIR's ``bfloat16`` dtype never reaches LLVM as ``bfloat``: ``BF16ComputeLegalize`` rewrites bf16 values
  to fp32, ``BF16StorageLegalize`` bf16 buffers to ``uint16``, and with both skipped the LLVM codegen
  segfaults on a bf16 load.  LLVM >= 17's ``llvm.x86.avx512bf16.dpbf16ps.512`` takes ``<32 x bfloat>``
  operands, and ``call_llvm_pure_intrin`` neither accepts nor casts to that type.
* So bf16 values live in ``uint16`` buffers (the top half of the fp32 bit pattern), and the tensor intrinsic
  calls ``forgekit_dpbf16ps(<16 x float>, <16 x i32>, <16 x i32>)``, a 4-line LLVM IR function that bitcasts
  to ``<32 x bfloat>`` and calls the instruction.  The schedule rule links it into the kernel with TVM's
  ``pragma_import_llvm`` loop annotation, which parses the IR, marks it always-inline and links it: one
  ``vdpbf16ps`` per call, no call left.

The legalizations (same layout as the int8 kernels, :mod:`.int8`):

* weights: fp32 constants rounded to bf16 at compile time and packed ``[OC/16, KH, KW, IC/2, 16, 2]``
  (matmul ``[N/16, K/2, 16, 2]``), so one 64-byte load feeds one instruction;
* activations: one prologue stage (``data_bf16``) that pads and rounds to bf16 (round to nearest even, as
  ``vcvtneps2bf16``), half the bytes of the fp32 input;
* ``acc[.., oc] += f32(x[.., 2c + i]) * f32(w[oc/16, .., c, oc%16, i])`` with the pair innermost, which
  :class:`.rules.gemm_bf16.GemmBf16Rule` tensorizes; an fp32 epilogue (channel slice, bias, relu) follows.

Grouped/depthwise convolutions, symbolic sizes other than a convolution's batch (a dynamic image size, a
matmul's symbolic rows) and non-constant weights keep the fp32 kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm
from tvm import relax, te

from ...errors import TargetError
from ...targets.isa import isa_info
from . import dot_conv, winograd
from .packed_conv import Legalize, _const_value, _int_or_expr, _ints, conv_geometry

if TYPE_CHECKING:
    from ...targets.isa import IsaInfo

LANES = 16      # fp32 accumulator lanes of one vdpbf16ps (zmm)
RED = 2         # bf16 products summed into one lane by one instruction
FEATURE = "avx512bf16"  # LLVM's feature name
PRECISION = "bfloat16"
INTRIN = "forgekit_dpbf16_16x2"
#: the instruction behind a type TVM can pass (see the module docstring), linked into each bf16 kernel
LLVM_IR = """
define <16 x float> @forgekit_dpbf16ps(<16 x float> %acc, <16 x i32> %a, <16 x i32> %b) {
  %x = bitcast <16 x i32> %a to <32 x bfloat>
  %y = bitcast <16 x i32> %b to <32 x bfloat>
  %r = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %acc, <32 x bfloat> %x, <32 x bfloat> %y)
  ret <16 x float> %r
}
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
"""


def has_bf16(tinfo: IsaInfo) -> bool:
    """Whether a target's instruction set has ``vdpbf16ps`` (AVX512_BF16 on a 512-bit x86 target)."""
    return tinfo.arch == "x86" and tinfo.vec_lanes == LANES and FEATURE in tinfo.features


def check_target(target: Any, name: str) -> None:
    """Refuse (one line, :class:`~forgekit.errors.TargetError`) a bf16 build for a target without AVX512_BF16."""
    if target is None or str(target.kind.name) != "llvm" or not has_bf16(isa_info(target)):
        raise TargetError(f"bf16 needs an x86 CPU target with AVX512_BF16 (vdpbf16ps); {name} has none: use "
                          "-t host on such a CPU (Zen 4, Sapphire Rapids and later) or an llvm target with "
                          "-mcpu=znver4 / sapphirerapids, or drop --precision bf16.")


def to_bf16(x: Any) -> Any:
    """fp32 -> bf16 bits (``uint16``), rounded to nearest even like ``vcvtneps2bf16`` (NaN payloads aside)."""
    u = tvm.tirx.reinterpret("uint32", x)
    one, half = tvm.tirx.const(1, "uint32"), tvm.tirx.const(0x7FFF, "uint32")
    sixteen = tvm.tirx.const(16, "uint32")
    return ((u + half + ((u >> sixteen) & one)) >> sixteen).astype("uint16")


def from_bf16(u: Any) -> Any:
    """bf16 bits (``uint16``) -> fp32 (exact)."""
    return tvm.tirx.reinterpret("float32", u.astype("uint32") << tvm.tirx.const(16, "uint32"))


def round_bf16(w: np.ndarray) -> np.ndarray:
    """numpy fp32 -> bf16 bits (``uint16``), the same rounding as :func:`to_bf16`."""
    u = np.ascontiguousarray(w, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _guarded(inside: Any, value: Any) -> Any:
    """``value`` where ``inside``, else a bf16 zero (the padding), without reading outside the input.

    Not ``Select``: TVM simplifies a Select's branches under its condition (``max(y - pt, 0)`` becomes
    ``y - pt``) but evaluates both, so the vectorized prologue loaded the row above the input (and the one
    below): PP-OCRv4 det segfaulted on ``vmovdqa64 -0xf180(%rcx)`` when its input lay at the start of a
    mapping.  ``if_then_else`` loads only when the condition holds."""
    return tvm.tirx.if_then_else(inside, value, tvm.tirx.const(0, "uint16"))


#: below these the fp32 kernel is faster (PP-OCRv4 det 640, per kernel, fp32 vs bf16 artifacts timed in one
#: process, alternating, min of 12, this 2-core Zen 4): 4 output channels (24->4 1x1 at 320x320: 0.49 vs
#: 0.92 ms, 16 lanes computed for 4) and 1x1 convs over 12 and 18 channels (0.75 vs 0.80 ms, 0.22 vs
#: 0.31 ms: a few vdpbf16ps per output after a rounding pass over the input); 24 input channels already
#: gain (1x1 24->96 at 160x160: 2.1 -> 0.78 ms)
MIN_CHANNELS = LANES // 2 + 1
MIN_PRODUCTS = 20


def worth_bf16(out_channels: int, products: int) -> bool:
    """Whether a conv/matmul with ``out_channels`` outputs of ``products`` products each gains from bf16."""
    return out_channels >= MIN_CHANNELS and products >= MIN_PRODUCTS


def _eligible(call: Any, w: np.ndarray | None) -> bool:
    data = call.args[0]
    return (w is not None and str(w.dtype) == "float32" and str(data.ty.dtype) == "float32"
            and str(call.attrs.out_dtype) in ("", "None", "void", "float32") and data.ty.shape is not None)


@dataclass(frozen=True)
class ConvPlan:
    """A conv2d the bf16 kernel runs (:func:`conv_plan`): NHWC input ``n, h, wd, ic`` (``n`` may be symbolic),
    HWIO fp32 weights ``w``, and the geometry of :func:`.packed_conv.conv_geometry`."""

    w: np.ndarray
    n: Any
    h: int
    wd: int
    ic: int
    strides: tuple[int, int]
    dilation: tuple[int, int]
    pads: tuple[int, int, int, int]
    out: tuple[int, int]
    winograd: bool


def conv_plan(call: Any) -> ConvPlan | None:
    """How the bf16 kernel runs ``call`` (a ``relax.nn.conv2d``), or None where the fp32 kernel keeps it: groups
    other than 1, layouts other than NHWC/HWIO, non-constant weights, symbolic sizes other than the batch (the
    fp32 kernel rounds those up to its register tile), and convs too small to gain (:func:`worth_bf16`)."""
    if getattr(call, "op", None) is None or getattr(call.op, "name", "") != "relax.nn.conv2d":
        return None
    a = call.attrs
    w = _const_value(call.args[1])
    if (not _eligible(call, w) or int(a.groups) != 1 or a.data_layout != "NHWC" or a.kernel_layout != "HWIO"
            or a.out_layout != "NHWC"):
        return None
    _, *hwc = call.args[0].ty.shape.values
    try:  # a symbolic batch is fine (a parallel loop)
        h, wd, ic = _ints(hwc)
    except Exception:  # pylint: disable=broad-except
        return None
    kh, kw, _, oc = w.shape
    if not worth_bf16(oc, ic * kh * kw):
        return None
    (sh, sw), (dh, dw), (pt, pl, pb, pr), out = conv_geometry(a, h, wd, kh, kw)
    n = _int_or_expr(call.args[0].ty.shape.values[0])
    return ConvPlan(w, n, h, wd, ic, (sh, sw), (dh, dw), (pt, pl, pb, pr), out,
                    ic % RED == 0 and winograd.applies(a, w, (n, h, wd, ic), LANES))


def emit_conv(bb: Any, plan: ConvPlan, data: Any, tinfo: IsaInfo, rounded: bool = False) -> Any:
    """The bf16 kernel of ``plan`` on ``data`` (fp32 NHWC, or with ``rounded`` its bf16 bits as ``uint16``, see
    :mod:`.bf16_activations`); returns the output call (fp32 NHWC)."""
    w, h, wd, ic = plan.w, plan.h, plan.wd, plan.ic
    kh, kw, _, oc = w.shape
    (sh, sw), (dh, dw), (pt, pl, pb, pr), (oh, ow) = plan.strides, plan.dilation, plan.pads, plan.out
    if plan.winograd:
        # F(2x2, 3x3) only: with F(4x4, 3x3)'s larger transforms around the rounding of V and U, one 64->64
        # conv at 56x56 kept a cosine of 0.99990 against float64 (F(2x2): 0.9999976, direct: 0.9999993)
        return winograd.emit(bb, data, w, (plan.n, h, wd, ic), (plan.n, oh, ow, oc), tinfo, winograd.F2,
                             winograd_gemm, load=from_bf16 if rounded else None, dilation=dh, pad=(pt, pl))
    icp, ocp = dot_conv.ceil_to(ic, RED), dot_conv.ceil_to(oc, LANES)
    packed = dot_conv.pack_weights(round_bf16(w), RED, LANES)

    # a 1x1 stride-2 downsample (ResNet-50: 56x56x256, 28x28x512, 14x14x1024) rounded its whole input,
    # 4x the pixels it reads
    subsample = kh == kw == 1 and (sh, sw) != (1, 1) and pt == pl == pb == pr == 0
    # bf16 input without padding: the kernel reads it as it is, no prologue pass over it
    direct = rounded and pt == pl == pb == pr == 0 and icp == ic
    owp = padded_width(ocp // LANES, ow, tinfo)

    def f(x: Any, wp: Any) -> Any:
        nb = x.shape[0]  # the placeholder's own batch (a symbolic one is a fresh var of this function)
        read = dot_conv.padded_reader(x, h, wd, ic, pt, pl)

        def padded(b: Any, y: Any, xx: Any, c: Any) -> Any:
            inside, v = read(b, y, xx, c)
            return _guarded(inside, v if rounded else to_bf16(v))
        if direct:
            xs = x
        elif subsample:  # a strided 1x1 reads one pixel in sh * sw: round only those
            xs = te.compute((nb, oh, ow, icp), lambda b, y, xx, c: padded(b, y * sh, xx * sw, c),
                            name="data_bf16")
        else:
            xs = te.compute((nb, h + pt + pb, wd + pl + pr, icp), padded, name="data_bf16")
        strides = (1, 1) if subsample and not direct else (sh, sw)
        acc = dot_conv.conv(xs, wp, (nb, oh, owp, ocp), (kh, kw), strides, (dh, dw), RED, LANES, from_bf16,
                            "conv2d_nhwc_bf16", None if owp == ow else ow)
        if ocp == oc and owp == ow:
            return acc
        return te.compute((nb, oh, ow, oc), lambda *i: acc(*i), name="T_slice_oc")
    return bb.call_te(f, data, relax.const(packed), primfunc_name_hint="conv2d_bf16")


def padded_width(nvec: int, ow: int, tinfo: IsaInfo) -> int:
    """The output columns the kernel computes: ``ow``, or up to an eighth more where ``ow`` has no divisor that
    makes a good register tile (a prime: :func:`.tiling.padded_rows` is the fp32 kernel's).  The extra columns
    repeat the last one's input and are sliced off in the epilogue.

    A 29- or 31-wide output (a 2x2/stride-1 or a 4x4/stride-1-2 ConvTranspose's phase conv on 28x28) got
    1-column tiles, each weight load feeding one ``vdpbf16ps``: 128 -> 128 channels on this 2-core Zen 4 ran at
    204 / 187 GFLOP/s, half of the 28-wide Conv's 431 / 435 (the fp32 kernel, which pads, 194 / 187)."""
    from .tiling import choose_dot_tile, stack_budget

    budget = stack_budget(tinfo, lanes=LANES)

    def reuse(cols: int) -> float:
        nv, rt = choose_dot_tile(nvec, cols, budget)
        return rt * nv / (rt + nv) * ow / cols  # dot products per load, less the wasted columns

    best = max(range(ow, ow + max(2, ow // 8) + 1), key=lambda cols: (reuse(cols), -cols))
    return best if reuse(best) >= 1.5 * reuse(ow) else ow


def make_conv2d_bf16_legalize(target: Any, fallback: Legalize) -> Legalize:
    """conv2d legalization: the bf16 kernel for the convs :func:`conv_plan` takes, ``fallback`` otherwise."""
    tinfo = isa_info(target)
    enabled = has_bf16(tinfo)

    def _legalize(bb: Any, call: Any) -> Any:
        plan = conv_plan(call) if enabled else None
        return fallback(bb, call) if plan is None else emit_conv(bb, plan, call.args[0], tinfo)
    return _legalize


def winograd_gemm(e: int, c: int, k: int, tiles: int) -> winograd.Gemm:
    """The ``e`` Winograd GEMMs (:mod:`.winograd`, a ``GemmFactory``) in bf16: V rounded as the input transform
    writes it, U rounded once from its fp32 transform and packed ``[E, K/16, C/2, 16, 2]`` like the conv
    weights here."""
    return winograd.pair_gemm(e, c, k, tiles, RED, LANES, round_bf16, from_bf16, "matmul_bf16", store=to_bf16)


def make_matmul_bf16_legalize(target: Any, fallback: Legalize) -> Legalize:
    """matmul legalization: the bf16 kernel for ``x[..., K] @ W[K, N]`` (fp32, constant ``W``, static shapes),
    ``fallback`` otherwise."""
    enabled = has_bf16(isa_info(target))

    def _legalize(bb: Any, call: Any) -> Any:
        x, weight = call.args
        w = _const_value(weight)
        if not enabled or not _eligible(call, w) or w.ndim != 2 or len(x.ty.shape.values) < 2:
            return fallback(bb, call)
        try:
            lead = _ints(x.ty.shape.values)[:-1]
        except Exception:  # pylint: disable=broad-except
            return fallback(bb, call)
        k, nn = w.shape
        if nn < MIN_CHANNELS:  # (MIN_PRODUCTS was measured on convolutions only)
            return fallback(bb, call)
        kp, npad = dot_conv.ceil_to(k, RED), dot_conv.ceil_to(nn, LANES)
        wpad = np.zeros((kp, npad), np.uint16)
        wpad[:k, :nn] = round_bf16(w)
        packed = np.ascontiguousarray(wpad.reshape(kp // RED, RED, npad // LANES, LANES).transpose(2, 0, 3, 1))

        def f(a: Any, wp: Any) -> Any:
            def rounded(*i: Any) -> Any:
                return _guarded(i[-1] < k, to_bf16(a[(*i[:-1], tvm.tirx.min(i[-1], k - 1))]))
            xs = te.compute((*lead, kp), rounded, name="data_bf16")
            r = te.reduce_axis((0, kp // RED), "rk")
            ri = te.reduce_axis((0, RED), "ri")
            acc = te.compute(
                (*lead, npad),
                lambda *i: te.sum(from_bf16(xs[(*i[:-1], r * RED + ri)])
                                  * from_bf16(wp[i[-1] // LANES, r, i[-1] % LANES, ri]), axis=[r, ri]),
                name="matmul_bf16")
            if npad == nn:
                return acc
            return te.compute((*lead, nn), lambda *i: acc(*i), name="T_slice_n")
        return bb.call_te(f, x, relax.const(packed), primfunc_name_hint="matmul_bf16")
    return _legalize


def register_intrin() -> str:
    """Register ``C[16] += sum_i f32(A[i]) * f32(B[16, i])`` (``i`` < 2; A, B bf16 bits) as one
    ``forgekit_dpbf16ps`` call with the data pair broadcast to every lane (once); returns its name."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    try:
        TensorIntrin.get(INTRIN)
        return INTRIN
    except Exception:  # pylint: disable=broad-except
        pass

    def f32(u: Any) -> Any:  # from_bf16, spelled as the tensorized block spells it
        return T.reinterpret(T.shift_left(T.Cast("uint32", u), T.uint32(16)), dtype="float32")

    @T.prim_func(s_tir=True)
    def desc(A: T.Buffer((RED,), "uint16", offset_factor=1), B: T.Buffer((LANES, RED), "uint16", offset_factor=1),
             C: T.Buffer((LANES,), "float32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:LANES], A[0:RED], B[0:LANES, 0:RED])
            T.writes(C[0:LANES])
            for i in T.serial(0, LANES):
                for k in T.serial(0, RED):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + f32(A[vk]) * f32(B[vi, vk])

    @T.prim_func(s_tir=True)
    def impl(A: T.Buffer((RED,), "uint16", offset_factor=1), B: T.Buffer((LANES, RED), "uint16", offset_factor=1),
             C: T.Buffer((LANES,), "float32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:LANES], A[0:RED], B[0:LANES, 0:RED])
            T.writes(C[0:LANES])
            # one expression, no temporaries (see int8.register_dot_intrin)
            C[T.ramp(T.int32(0), 1, LANES)] = T.call_extern(
                "float32x16", "forgekit_dpbf16ps", C.vload([0], dtype="float32x16"),
                T.broadcast(T.reinterpret(A.vload([0], "uint16x2"), dtype="int32"), LANES),
                T.reinterpret(B.vload([0, 0], dtype="uint16x32"), dtype="int32x16"))

    TensorIntrin.register(INTRIN, desc, impl)
    return INTRIN
