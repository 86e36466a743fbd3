"""Quantized operators the Relax frontend lacks.

* ``ConvInteger``: ``conv(x - x_zp, w - w_zp)`` in int32 (the zero-point subtraction
  before padding gives ONNX's "pad with the zero point" semantics).
* ``QLinearConv`` / ``QLinearMatMul``: the int32 accumulation above, then
  requantisation as onnxruntime does it: ``y = sat(round_half_even(acc * (x_s*w_s/y_s)) + y_zp)``
  with the multiplier computed in float32 (per output channel when ``w_scale`` is a vector).
* ``com.microsoft`` QOperator element-wise ops (``QLinearAdd``, ``QLinearMul``,
  ``QLinearSigmoid``, ``QLinearLeakyRelu``, ``QLinearGlobalAveragePool``,
  ``QLinearAveragePool``, ``QLinearConcat``, ``QLinearSoftmax``): dequantize ->
  float op -> quantize.  These may differ from onnxruntime by one quantum
  (onnxruntime uses fixed-point / lookup-table kernels for some of them).

Accumulation is int32, exact.  With constant 8-bit weights and a scalar input zero point (onnxruntime's
quantizers write nothing else) the conv runs on the 8-bit operands (:mod:`.int_conv`); otherwise on widened
int32 operands, not the fastest.
"""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _fe

from ._common import OnnxOpConverter, const_value, dtype_of, ndim_of
from .int_conv import fast_int_conv

_QRANGE = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767)}


def _i32(x):
    return relax.op.astype(x, "int32")


def _channel_view(bb, v, ndim, axis=1):
    """Reshape a per-channel vector for broadcasting along ``axis`` of an ndim tensor."""
    v = bb.normalize(v)
    if ndim_of(v) == 0 or ndim <= 1:
        return v
    shape = [1] * ndim
    shape[axis] = -1
    return relax.op.reshape(v, shape)


def _sub_zp(bb, x, zp, ndim, axis=None):
    x = _i32(x)
    if zp is None:
        return x
    zp = bb.normalize(_i32(zp))
    if ndim_of(zp) >= 1 and axis is not None:
        zp = _channel_view(bb, zp, ndim, axis)
    return relax.op.subtract(x, zp)


def _requantize(bb, acc, multiplier, y_zp, out_dtype):
    """sat(round(acc * multiplier) + y_zp) like MlasRequantizeOutput."""
    op = relax.op
    lo, hi = _QRANGE[out_dtype]
    val = op.multiply(op.astype(acc, "float32"), multiplier)
    zp_f = op.astype(y_zp, "float32") if y_zp is not None else relax.const(0.0, "float32")
    val = op.add(op.round(val), zp_f)
    val = op.clip(val, lo, hi)
    return op.astype(val, out_dtype)


def _out_dtype(y_zp, default="uint8"):
    return dtype_of(y_zp) if y_zp is not None else default


def _int_conv(bb, inputs, attr, params):
    x, w = inputs[0], inputs[1]
    x_zp = inputs[2] if len(inputs) > 2 else None
    w_zp = inputs[3] if len(inputs) > 3 else None
    fast = fast_int_conv(bb, x, w, x_zp, w_zp, attr)
    if fast is not None:
        return fast
    nd = ndim_of(x)
    x32 = bb.normalize(_sub_zp(bb, x, x_zp, nd))
    w32 = bb.normalize(_sub_zp(bb, w, w_zp, ndim_of(w), axis=0))
    return _fe.Conv._impl_v11(bb, [x32, w32, None], dict(attr), params)


class ConvInteger(OnnxOpConverter):
    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        return _int_conv(bb, list(inputs) + [None] * (4 - len(inputs)), attr, params)


class QLinearConv(OnnxOpConverter):
    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        inputs = list(inputs) + [None] * (9 - len(inputs))
        x, xs, xzp, w, ws, wzp, ys, yzp, bias = inputs[:9]
        op = relax.op
        acc = bb.normalize(_int_conv(bb, [x, w, xzp, wzp], attr, params))
        nd = ndim_of(acc)
        if bias is not None:
            acc = op.add(acc, op.reshape(bb.normalize(_i32(bias)), [1, -1] + [1] * (nd - 2)))
        ws_v = _channel_view(bb, op.astype(ws, "float32"), nd, axis=1)
        mult = bb.normalize(op.divide(op.multiply(op.astype(xs, "float32"), ws_v), op.astype(ys, "float32")))
        return _requantize(bb, acc, mult, yzp, _out_dtype(yzp, dtype_of(x)))


def _fast_int_matmul(bb, a, b, a_zp, b_zp):
    """8-bit ``(a - za) @ (B - zb)`` with int32 accumulation on 8-bit operands (the VNNI kernels' input).

    Valid for a constant 2-D ``B`` (int8, or uint8 shifted to int8 with its zero point) with a constant zero
    point (scalar or per column) and a scalar ``a_zp`` (constant, or computed at run time as
    ``DynamicQuantizeLinear`` does)::

        (a - za) @ (B - zb) = a @ B - za * colsum(B) - zb * rowsum(a) + K * za * zb

    exact in int32.  A uint8 ``B`` (onnxruntime's ``quantize_dynamic`` default) becomes ``B - 128`` with zero
    point ``zb - 128``: a uint8 classifier (1024 x 8210, 20 rows) took 9.3 ms on TVM's int32 matmul.
    """
    bv = const_value(b)
    bzv = const_value(b_zp) if b_zp is not None else np.zeros((), np.int32)
    if bv is None or bv.ndim != 2 or bzv is None or str(bv.dtype) not in ("int8", "uint8"):
        return None
    if bzv.ndim > 1 or (bzv.ndim == 1 and bzv.size not in (1, bv.shape[1])):
        return None
    if dtype_of(a) not in ("uint8", "int8") or (a_zp is not None and ndim_of(a_zp) > 0 and
                                                 int(np.prod([int(d) for d in a_zp.ty.shape.values])) != 1):
        return None
    zb = bzv.astype(np.int32).reshape(-1)
    if str(bv.dtype) == "uint8":
        bv, zb = (bv.astype(np.int16) - 128).astype(np.int8), zb - 128
    zb = zb[0] if zb.size == 1 else zb
    op = relax.op
    acc = op.matmul(a, relax.const(bv), out_dtype="int32")
    colsum = bv.astype(np.int64).sum(axis=0).astype(np.int32)
    za = None
    if a_zp is not None:
        za = op.reshape(_i32(a_zp), []) if ndim_of(a_zp) > 0 else _i32(a_zp)
        acc = op.subtract(acc, op.multiply(relax.const(colsum), za))
    if np.any(zb != 0):
        zbc = relax.const(np.asarray(zb, np.int32))
        rowsum = op.sum(op.astype(a, "int32"), axis=[-1], keepdims=True)
        acc = op.subtract(acc, op.multiply(rowsum, zbc))
        if za is not None:
            acc = op.add(acc, op.multiply(op.multiply(za, relax.const(np.int32(bv.shape[0]))), zbc))
    return acc


class MatMulInteger(OnnxOpConverter):
    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        a, b, a_zp, b_zp = _pad(inputs, 4)[:4]
        fast = _fast_int_matmul(bb, a, b, a_zp, b_zp)
        if fast is not None:
            return fast
        return _fe.MatMulInteger._impl_v10(bb, [a, b, a_zp, b_zp], attr, params)


def _reduce_all(reduce, x):
    """``reduce`` over every axis, the last one first: a row reduction the CPU rules vectorize and spread over
    the threads, then a short one.  A reduction straight to a scalar took the fallback schedule (one thread,
    scalar): 1.5 ms of an 8 ms int8 CRNN in its DynamicQuantizeLinear ranges.  Min and max are exact in any
    order."""
    if ndim_of(x) >= 2:
        x = reduce(x, axis=[-1])
    return reduce(x)


class DynamicQuantizeLinear(OnnxOpConverter):
    """uint8 quantization with the range of the tensor itself, as onnxruntime computes it
    (``GetQuantizationParameter`` + ``MlasQuantizeLinear``)::

        lo, hi = min(min(x), 0), max(max(x), 0)
        scale = 1 if hi == lo else (hi - lo) / 255               # float32
        zp = round_half_even(clip(0 - lo / scale, 0, 255))
        y = clip(round_half_even(x / scale) + zp, 0, 255)        # a true division, not x * (1 / scale)

    TVM's converter divided by a zero scale for a constant (all-zero) tensor: NaN cast to uint8, which
    onnxruntime quantizes to zero point 0 with scale 1 (a T5 encoder's masked rows, issue 39).  ``round``
    lowers to LLVM's ``nearbyint``: half to even under the default rounding mode, like ``_mm_cvtps_epi32``."""

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        op = relax.op
        x = inputs[0]
        zero, q = relax.const(0.0, "float32"), relax.const(255.0, "float32")
        hi = bb.normalize(op.maximum(zero, _reduce_all(op.max, x)))
        lo = bb.normalize(op.minimum(zero, _reduce_all(op.min, x)))
        scale = bb.normalize(op.where(op.equal(hi, lo), relax.const(1.0, "float32"),
                                      op.divide(op.subtract(hi, lo), q)))
        zp = bb.normalize(op.astype(op.round(op.clip(op.subtract(zero, op.divide(lo, scale)), 0, 255)), "uint8"))
        # relax's quantize is clip(round(x / scale) + zp) as above; spelled as clip + astype instead, the cast
        # fused into the MatMulInteger kernel as a prologue and kept it off the VNNI rule
        y = op.quantize(x, scale, zp, axis=0, out_dtype="uint8")
        return relax.Tuple([y, scale, zp])


class QLinearMatMul(OnnxOpConverter):
    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        a, a_s, a_zp, b, b_s, b_zp, ys, yzp = list(inputs)[:8]
        acc = MatMulInteger._impl_v10(bb, [a, b, a_zp, b_zp], attr, params)
        op = relax.op
        b_s = bb.normalize(op.astype(b_s, "float32"))
        a_s = bb.normalize(op.astype(a_s, "float32"))
        if ndim_of(a_s) == 1 and ndim_of(a) >= 2:  # per-row scale [M]
            a_s = op.expand_dims(a_s, axis=-1)
        mult = bb.normalize(op.divide(op.multiply(a_s, b_s), op.astype(ys, "float32")))
        return _requantize(bb, acc, mult, yzp, _out_dtype(yzp, dtype_of(a)))


# ------------------------------------------------------------------ com.microsoft QOperator ops
def _dq(x, s, zp):
    op = relax.op
    xf = op.astype(x, "float32")
    if zp is not None:
        xf = op.subtract(xf, op.astype(zp, "float32"))
    return op.multiply(xf, op.astype(s, "float32"))


def _q(xf, s, zp, dtype):
    op = relax.op
    lo, hi = _QRANGE[dtype]
    v = op.round(op.divide(xf, op.astype(s, "float32")))
    if zp is not None:
        v = op.add(v, op.astype(zp, "float32"))
    return op.astype(op.clip(v, lo, hi), dtype)


def _pad(inputs, n):
    return list(inputs) + [None] * (n - len(inputs))


class _QBinary(OnnxOpConverter):
    FN = None

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        a, a_s, a_zp, b, b_s, b_zp, c_s, c_zp = _pad(inputs, 8)[:8]
        y = cls.FN(_dq(a, a_s, a_zp), _dq(b, b_s, b_zp))
        return _q(y, c_s, c_zp, _out_dtype(c_zp, dtype_of(a)))


class QLinearAdd(_QBinary):
    FN = staticmethod(relax.op.add)


class QLinearMul(_QBinary):
    FN = staticmethod(relax.op.multiply)


class QLinearSigmoid(OnnxOpConverter):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x, xs, xzp, ys, yzp = _pad(inputs, 5)[:5]
        return _q(relax.op.sigmoid(_dq(x, xs, xzp)), ys, yzp, _out_dtype(yzp, dtype_of(x)))


class QLinearLeakyRelu(OnnxOpConverter):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x, xs, xzp, ys, yzp = _pad(inputs, 5)[:5]
        y = relax.op.nn.leakyrelu(_dq(x, xs, xzp), float(attr.get("alpha", 0.01)))
        return _q(y, ys, yzp, _out_dtype(yzp, dtype_of(x)))


class QLinearGlobalAveragePool(OnnxOpConverter):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x, xs, xzp, ys, yzp = _pad(inputs, 5)[:5]
        if int(attr.get("channels_last", 0)):
            raise ValueError("QLinearGlobalAveragePool with channels_last=1 is not supported")
        xf = bb.normalize(_dq(x, xs, xzp))
        y = relax.op.mean(xf, axis=list(range(2, ndim_of(xf))), keepdims=True)
        return _q(y, ys, yzp, _out_dtype(yzp, dtype_of(x)))


class QLinearAveragePool(OnnxOpConverter):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x, xs, xzp, ys, yzp = _pad(inputs, 5)[:5]
        if int(attr.get("channels_last", 0)):
            raise ValueError("QLinearAveragePool with channels_last=1 is not supported")
        a = {k: v for k, v in attr.items() if k != "channels_last"}
        xf = bb.normalize(_dq(x, xs, xzp))
        y = _fe.AveragePool.get_converter(19)(bb, [xf], a, params)
        return _q(y, ys, yzp, _out_dtype(yzp, dtype_of(x)))


class QLinearConcat(OnnxOpConverter):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        ys, yzp = inputs[0], inputs[1]
        rest = list(inputs[2:])
        parts = [_dq(rest[i], rest[i + 1], rest[i + 2]) for i in range(0, len(rest), 3)]
        y = relax.op.concat(parts, axis=int(attr.get("axis", 0)))
        return _q(y, ys, yzp, _out_dtype(yzp, dtype_of(rest[0])))


class QLinearSoftmax(OnnxOpConverter):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x, xs, xzp, ys, yzp = _pad(inputs, 5)[:5]
        y = relax.op.nn.softmax(_dq(x, xs, xzp), axis=int(attr.get("axis", -1)))
        return _q(y, ys, yzp, _out_dtype(yzp, dtype_of(x)))


class QGemm(OnnxOpConverter):
    """com.microsoft QGemm: int GEMM (+ int32 bias), float output or requantized output."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        op = relax.op
        a, a_s, a_zp, b, b_s, b_zp, c, y_s, y_zp = _pad(inputs, 9)[:9]
        alpha = float(attr.get("alpha", 1.0))
        trans_a, trans_b = int(attr.get("transA", 0)), int(attr.get("transB", 0))
        a32 = bb.normalize(_sub_zp(bb, a, a_zp, ndim_of(a)))
        b32 = _i32(b)
        if b_zp is not None:
            zp = bb.normalize(_i32(b_zp))
            if ndim_of(zp) == 1 and trans_b:
                zp = op.expand_dims(zp, axis=-1)
            b32 = op.subtract(b32, zp)
        if trans_a:
            a32 = op.permute_dims(a32)
        if trans_b:
            b32 = op.permute_dims(b32)
        acc = op.matmul(a32, b32, out_dtype="int32")
        if c is not None:
            acc = op.add(acc, _i32(c))
        scale = op.multiply(op.multiply(relax.const(alpha, "float32"), op.astype(a_s, "float32")),
                            op.astype(b_s, "float32"))
        if y_s is None:
            return op.multiply(op.astype(acc, "float32"), scale)
        mult = bb.normalize(op.divide(scale, op.astype(y_s, "float32")))
        return _requantize(bb, acc, mult, y_zp, _out_dtype(y_zp, dtype_of(a)))


CONVERTERS = {
    "DynamicQuantizeLinear": DynamicQuantizeLinear,
    "QGemm": QGemm,
    "ConvInteger": ConvInteger,
    "QLinearConv": QLinearConv,
    "QLinearMatMul": QLinearMatMul,
    "MatMulInteger": MatMulInteger,
    "QLinearAdd": QLinearAdd,
    "QLinearMul": QLinearMul,
    "QLinearSigmoid": QLinearSigmoid,
    "QLinearLeakyRelu": QLinearLeakyRelu,
    "QLinearGlobalAveragePool": QLinearGlobalAveragePool,
    "QLinearAveragePool": QLinearAveragePool,
    "QLinearConcat": QLinearConcat,
    "QLinearSoftmax": QLinearSoftmax,
}
