"""Integer conv2d/matmul (int8/uint8 data x int8 constant weights -> int32) for dot-product CPUs.

Two instructions multiply 4 bytes by 4 bytes and add the 4 products to an int32 lane:

* x86 AVX512-VNNI ``vpdpbusd``: *unsigned* data x *signed* weights, 16 lanes (64 multiply-adds, 4x an
  fp32 FMA);
* ARMv8.2 dot product ``sdot``: signed x signed, 4 lanes of a NEON register (16 multiply-adds, 4x an
  fp32 FMA).

To use them the legalizations below

* pad the data in NHWC (conv: spatial padding and channels to a multiple of 4; matmul: K) and shift it
  into the signedness the instruction wants (int8 data + 128 for VNNI, uint8 data - 128 for sdot; padding
  becomes the shifted zero; the error this adds, ``offset * sum(W)`` per output channel, is a constant
  subtracted in the epilogue);
* pack the constant weights at compile time as ``[OC/L, KH, KW, IC/4, L, 4]`` (``[N/L, K/4, L, 4]``)
  for ``L`` lanes, so one vector load feeds one instruction;
* compute ``acc[.., oc] += x[.., 4c + i] * w[oc/L, .., c, oc%L, i]`` with the 4-element reduction
  innermost, which :class:`rules.gemm_int8.GemmInt8Rule` tensorizes into the instruction.

Without a dot-product instruction (and for grouped convolutions) the stock integer legalization runs:
exact, not faster.  Where the instruction multiplies 2 bytes per lane (AVX2's ``vpmaddwd``) or there is none,
3x3 stride-1 convolutions run Winograd instead (:mod:`.int8_winograd`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm
from tvm import relax, te

from ...targets.isa import isa_info
from . import dot_conv, int8_winograd
from .packed_conv import (  # shared legalization helpers
    Legalize,
    _const_value,
    _default,
    _int_or_expr,
    conv_geometry,
    exact_in_fp32,
)
from .tiling import stack_budget

if TYPE_CHECKING:
    from ...targets.isa import IsaInfo

RED = 4      # bytes reduced into one int32 lane by one instruction
INT8_TYPES = ("int8", "uint8")


@dataclass(frozen=True)
class DotKernel:
    """One integer dot-product instruction as the int8 kernels use it."""

    key: str            # IsaInfo.dot
    rule: str           # schedule rule name (compile reports, STATS)
    lanes: int          # int32 accumulator lanes of one instruction
    data_dtype: str     # the data operand's type: signedness the instruction wants, or int16 (widened)
    llvm_intrin: str    # the LLVM intrinsic
    red: int = RED      # elements one lane sums per instruction
    weight_dtype: str = "int8"    # as the packed weights are stored
    operand_dtype: str = "int8"   # the intrinsic's vector elements (stored weights are widened to it)
    #: the intrinsic returns the products' sums rather than accumulating them (``vpmaddwd``: an add follows)
    adds: bool = False

    def register(self) -> str:
        """Register the kernel's tensor intrinsic (once) and return its name."""
        return register_dot_intrin(f"forgekit_dot_{self.lanes}x{self.red}_{self.key}", self)

    def shift(self, x_dtype: str) -> int:
        """What to add to ``x_dtype`` data to bring it into :attr:`data_dtype` (padding: the same value,
        the shifted zero); int16 holds int8 and uint8 data alike."""
        if x_dtype == self.data_dtype or self.data_dtype == "int16":
            return 0
        return 128 if self.data_dtype == "uint8" else -128


def has_vnni(target: Any) -> bool:
    """Whether an llvm target has AVX512-VNNI (``vpdpbusd``)."""
    return isa_info(target).dot == "vnni"


def dot_kernel(tinfo: IsaInfo) -> DotKernel | None:
    """The :class:`DotKernel` of a :class:`~forgekit.targets.isa.IsaInfo`, or None."""
    return KERNELS.get(tinfo.dot)


def is_int8_call(call: Any) -> bool:
    """An integer conv2d/matmul the int8 legalizations handle (int8/uint8 data, int8 constant weight)."""
    if len(call.args) != 2 or str(call.attrs.out_dtype) != "int32":
        return False
    data, weight = call.args
    return (str(data.ty.dtype) in INT8_TYPES and _const_value(weight) is not None
            and str(weight.ty.dtype) == "int8")


def _guarded(inside: Any, value: Any, pad: int, dtype: str) -> Any:
    """``value`` where ``inside``, else ``pad`` (the shifted zero), without reading outside the input.

    Not ``Select``: TVM simplifies a Select's branches under its condition (the index clamps vanish) but
    evaluates both, so the vectorized prologue loaded the rows above and below the input: an int8 NHWC
    conv on an input between two PROT_NONE pages segfaulted (test_int8_detector; the bf16 prologue
    crashed PP-OCRv4 det the same way).  ``if_then_else`` loads only when the condition holds."""
    return tvm.tirx.if_then_else(inside, value, tvm.tirx.const(pad, dtype))


def _stage_name(dtype: str) -> str:
    return "data_u8" if dtype == "uint8" else "data_s8"


def make_conv2d_int8_legalize(target: Any, fallback: Legalize) -> Legalize:
    """conv2d legalization: the dot-product kernel for int8 NHWC/HWIO convolutions, ``fallback`` otherwise."""
    tinfo = isa_info(target)
    kernel = dot_kernel(tinfo)

    def _legalize(bb: Any, call: Any) -> Any:
        if not is_int8_call(call):
            return fallback(bb, call)
        a = call.attrs
        if ((kernel is None or kernel.red < RED)
                and (wino := int8_winograd.emit_conv(bb, call, tinfo, kernel)) is not None):
            return wino
        if exact_in_fp32(call, _const_value(call.args[1])) and (kernel is None or int(a.groups) != 1):
            # depthwise (and everything without a dot product) that fp32 computes exactly: the fp32 kernel
            return fallback(bb, call)
        if (kernel is None or a.data_layout != "NHWC" or a.kernel_layout != "HWIO" or a.out_layout != "NHWC"
                or int(a.groups) != 1):
            return _default(bb, call)
        data, weight = call.args
        # the batch may stay symbolic (the kernel's rows are pixels of one image, the dot-tile rule fuses the
        # batch into its parallel loop): the stock integer conv it fell back to made a dynamic-batch int8
        # ResNet-style classifier 1.6x slower than its fp32 (issue 39: 1.75 against 1.12 ms at 64x64)
        # so may the image (a detector's dynamic H and W): the stock integer conv it fell back to ran a dynamic
        # size int8 model 4x slower than its fp32 (14.6 against 3.6 ms, 6 convs at 128x160 on Zen 4)
        n, h, wd, ic = (_int_or_expr(v) for v in data.ty.shape.values)
        if not isinstance(ic, int):
            return _default(bb, call)
        w = _const_value(weight).astype(np.int32)
        kh, kw, _, oc = w.shape
        (sh, sw), (dh, dw), (pt, pl, pb, pr), (oh, ow) = conv_geometry(a, h, wd, kh, kw)
        if not isinstance(oh, int) or not isinstance(ow, int):
            # Relax's own (simplified) output extents, as the fp32 conv takes them (FuseTIR matches buffers)
            _, oh, ow, _ = (_int_or_expr(v) for v in call.ty.shape.values)
        lanes, red = kernel.lanes, kernel.red
        icp, ocp = dot_conv.ceil_to(ic, red), dot_conv.ceil_to(oc, lanes)
        owp = dot_conv.output_width(ow, ocp // lanes, stack_budget(isa_info(target), lanes=lanes))
        packed = dot_conv.pack_weights(w.astype(kernel.weight_dtype), red, lanes)
        offset, xd = kernel.shift(str(data.ty.dtype)), kernel.data_dtype
        comp = (offset * w.sum(axis=(0, 1, 2))).astype(np.int32)  # what the +offset adds per output channel

        def f(x: Any, wp: Any, cmp: Any) -> Any:
            read = dot_conv.padded_reader(x, h, wd, ic, pt, pl)

            def shifted(b: Any, y: Any, xx: Any, c: Any) -> Any:
                inside, v = read(b, y, xx, c)
                return _guarded(inside, (v.astype("int32") + offset).astype(xd), offset, xd)
            if offset == 0 and xd == str(data.ty.dtype) and icp == ic and not any((pt, pl, pb, pr)):
                # nothing to pad or shift: read the activation in place instead of copying it (a full
                # pass over the input per conv; the uint8 1x1 convs of YOLOv8's C2f/SPPF/head)
                xs = x
            else:
                xs = te.compute((n, h + pt + pb, wd + pl + pr, icp), shifted, name=_stage_name(xd))
            acc = dot_conv.conv(xs, wp, (n, oh, owp, ocp), (kh, kw), (sh, sw), (dh, dw), red, lanes,
                                lambda v: v.astype("int32"), "conv2d_nhwc_int8", None if owp is ow else ow)
            return te.compute((n, oh, ow, oc), lambda b, y, xx, ff: acc[b, y, xx, ff] - cmp[ff], name="T_int8_fixup")
        return bb.call_te(f, data, relax.const(packed), relax.const(comp), primfunc_name_hint="conv2d_int8")
    return _legalize


def make_matmul_int8_legalize(target: Any, fallback: Legalize) -> Legalize:
    """matmul legalization: the dot-product kernel for ``x[..., K] @ W[K, N]`` with int8 constant ``W``."""
    kernel = dot_kernel(isa_info(target))

    def _legalize(bb: Any, call: Any) -> Any:
        if not is_int8_call(call):
            return fallback(bb, call)
        x, weight = call.args
        w = _const_value(weight)
        if kernel is None or w.ndim != 2 or x.ty.shape is None:
            return _default(bb, call)
        xs_shape = list(x.ty.shape.values)
        try:
            k = int(xs_shape[-1])
        except Exception:  # pylint: disable=broad-except
            return _default(bb, call)
        nn = w.shape[1]
        lanes, red = kernel.lanes, kernel.red
        kp, npad = dot_conv.ceil_to(k, red), dot_conv.ceil_to(nn, lanes)
        wpad = np.zeros((kp, npad), kernel.weight_dtype)
        wpad[:k, :nn] = w
        packed = np.ascontiguousarray(wpad.reshape(kp // red, red, npad // lanes, lanes).transpose(2, 0, 3, 1))
        offset, xd = kernel.shift(str(x.ty.dtype)), kernel.data_dtype
        comp = (offset * w.astype(np.int32).sum(axis=0)).astype(np.int32)
        lead = xs_shape[:-1]

        def f(a: Any, wp: Any, cmp: Any) -> Any:
            def shifted(*i: Any) -> Any:
                v = (a[(*i[:-1], tvm.tirx.min(i[-1], k - 1))].astype("int32") + offset).astype(xd)
                return _guarded(i[-1] < k, v, offset, xd)
            xs = te.compute((*lead, kp), shifted, name=_stage_name(xd))
            r = te.reduce_axis((0, kp // red), "rk")
            ri = te.reduce_axis((0, red), "ri")
            acc = te.compute(
                (*lead, npad),
                lambda *i: te.sum(xs[(*i[:-1], r * red + ri)].astype("int32")
                                  * wp[i[-1] // lanes, r, i[-1] % lanes, ri].astype("int32"), axis=[r, ri]),
                name="matmul_int8")
            return te.compute((*lead, nn), lambda *i: acc(*i) - cmp[i[-1]], name="T_int8_fixup")
        return bb.call_te(f, x, relax.const(packed), relax.const(comp), primfunc_name_hint="matmul_int8")
    return _legalize


# ---------------------------------------------------------------- the tensor intrinsics
def register_dot_intrin(name: str, kernel: DotKernel) -> str:
    """Register ``C[lanes] += sum_k A[k] * B[lanes, k]`` (``k`` < ``kernel.red``; A ``data_dtype``, B
    ``weight_dtype``, C int32) as one call of the kernel's LLVM intrinsic with the ``red`` data elements
    broadcast to every lane (and an add, for an intrinsic that does not accumulate).  TVM has the same
    intrinsics (``dot_16x4_vnni``, ``dot_4x4_i8i8s32_sdot``) in ``tvm.s_tir.tensor_intrin``, whose import also
    loads every CUDA intrinsic (~30 s); its VNNI copy also passes ``<16 x i32>`` operands, which LLVM >= 20's
    ``(<16 x i32>, <64 x i8>, <64 x i8>)`` signature rejects."""
    from tvm.s_tir import TensorIntrin
    from tvm.script import tirx as T

    try:
        TensorIntrin.get(name)
        return name
    except Exception:  # pylint: disable=broad-except
        pass
    lanes, red, xd, wd = kernel.lanes, kernel.red, kernel.data_dtype, kernel.weight_dtype
    acc, vec = f"int32x{lanes}", f"{kernel.operand_dtype}x{lanes * red}"

    @T.prim_func(s_tir=True)
    def desc(A: T.Buffer((red,), xd, offset_factor=1), B: T.Buffer((lanes, red), wd, offset_factor=1),
             C: T.Buffer((lanes,), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:red], B[0:lanes, 0:red])
            T.writes(C[0:lanes])
            for i in T.serial(0, lanes):
                for k in T.serial(0, red):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

    intrin = T.llvm_lookup_intrinsic_id(kernel.llvm_intrin)

    def data(A: T.Buffer) -> T.PrimExpr:  # the red elements as one int32, in every lane
        return T.reinterpret(T.broadcast(T.reinterpret(A.vload([0], f"{xd}x{red}"), dtype="int32"), lanes), dtype=vec)

    def weights(B: T.Buffer) -> T.PrimExpr:  # one vector load (widened: one vpmovsxbw)
        stored = B.vload([0, 0], dtype=f"{wd}x{lanes * red}")
        return stored if wd == kernel.operand_dtype else T.Cast(vec, stored)

    def update(A: T.Buffer, B: T.Buffer, C: T.Buffer) -> T.PrimExpr:
        if kernel.adds:  # vpmaddwd returns the pair sums: an add follows
            return C.vload([0], dtype=acc) + T.call_llvm_pure_intrin(intrin, data(A), weights(B), dtype=acc)
        return T.call_llvm_pure_intrin(intrin, C.vload([0], dtype=acc), data(A), weights(B), dtype=acc)

    @T.prim_func(s_tir=True)
    def impl(A: T.Buffer((red,), xd, offset_factor=1), B: T.Buffer((lanes, red), wd, offset_factor=1),
             C: T.Buffer((lanes,), "int32", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:red], B[0:lanes, 0:red])
            T.writes(C[0:lanes])
            # one expression, no temporaries: a TVMScript temporary becomes a "local" buffer, and TVM 0.27
            # serves every "local" allocation with TVMBackendAllocWorkspace (a call per use)
            C[T.ramp(T.int32(0), 1, lanes)] = update(A, B, C)

    # the accumulator is a default-scope buffer under 1 KiB (see rules.common.acc_scope): tensorize
    # compares storage scopes, so the schedule must give the tile exactly this scope
    TensorIntrin.register(name, desc, impl)
    return name


#: x86 AVX512-VNNI: u8 x s8, 16 lanes of a zmm register
VNNI = DotKernel("vnni", "gemm_int8_vnni", 16, "uint8", "llvm.x86.avx512.vpdpbusd.512")
#: ARMv8.2 dot product: s8 x s8, 4 lanes of a NEON register (the broadcast becomes one ld1r)
SDOT = DotKernel("sdot", "gemm_int8_sdot", 4, "int8", "llvm.aarch64.neon.sdot.v4i32.v16i8")
#: x86 AVX2 without a dot-product instruction: ``vpmaddwd`` multiplies int16 pairs and sums each pair into an
#: int32 lane (8 lanes of a ymm register), then an add.  The data is widened to int16 in the kernel's staging
#: copy and the weights at compile time, so it is exact (``vpmaddubsw`` on the bytes, onnxruntime's AVX2
#: u8s8 path, saturates its int16 pair sums: forgekit.evaluate.reference).  Measured on a Zen 3 (2 threads):
#: the generic integer code ran a 6-conv int8 net at 3.9x its fp32 (39.6 against 10.1 ms).
AVX2 = DotKernel("avx2", "gemm_int8_avx2", 8, "int16", "llvm.x86.avx2.pmadd.wd", red=2, weight_dtype="int16",
                 operand_dtype="int16", adds=True)
#: IsaInfo.dot -> kernel
KERNELS = {k.key: k for k in (VNNI, SDOT, AVX2)}
