"""Custom legalizations: vectorizable polynomial exp / erf / tanh / sigmoid (topi.fast_*) instead of scalar
libm calls, and a softmax built from them.  `erf` in the BERT GELU epilogue was 8x the cost of the
matmul it is fused into before this (libm erff is a scalar call that blocks vectorization)."""

from __future__ import annotations

from typing import Any, Callable

import tvm
from tvm import topi
from tvm.relax.transform.legalize_ops.common import register_legalize  # noqa: F401  (doc link)


def _default(bb: Any, call: Any) -> Any:
    """Fall back to the op's stock legalization."""
    import tvm
    return tvm.ir.Op.get(call.op.name).get_attr("FLegalize")(bb, call)


def _unary(fn: Callable[..., Any], name: str) -> Callable[[Any, Any], Any]:
    def _legalize(bb: Any, call: Any) -> Any:
        if str(call.args[0].ty.dtype) != "float32":
            return _default(bb, call)
        return bb.call_te(fn, call.args[0], primfunc_name_hint=name)
    return _legalize


#: softmax rows are padded to a multiple of this (the widest vector: AVX-512's 16 fp32 lanes, a multiple of
#: AVX2's 8 and NEON's 4)
ROW_MULTIPLE = 16
LOWEST = float(-3.4028234663852886e38)  # float32's lowest finite value: exp(LOWEST - max) underflows to ~0


def _softmax(bb: Any, call: Any) -> Any:
    x = call.args[0]
    if str(x.ty.dtype) != "float32":
        return _default(bb, call)
    ndim = len(x.ty.shape.values)
    axis = int(call.attrs.axis)
    axis = axis + ndim if axis < 0 else axis

    shape = x.ty.shape.values
    length = shape[axis] if axis == ndim - 1 else None
    pad = (-int(length)) % ROW_MULTIPLE if isinstance(length, tvm.tirx.IntImm) and int(length) >= 4 * ROW_MULTIPLE \
        else 0

    def f(data: Any) -> Any:
        # a row whose length is not a multiple of the vector lanes (a CTC head's 6625 classes) is reduced over a
        # copy padded with the lowest float: exp(lowest - max) underflows to ~0, and the row reduction rule can
        # then split it into whole vectors (it reduced 6625 scalars one at a time: PP-OCRv4 rec's 40 x 6625
        # softmax 1.04 -> 0.3 ms alone); the pad is an if_then_else inlined into the reductions
        src = topi.nn.pad(data, [0] * ndim, [0] * (ndim - 1) + [pad], pad_value=LOWEST) if pad else data
        m = topi.max(src, axis=axis, keepdims=True)
        s = topi.sum(topi.fast_exp(topi.subtract(src, m)), axis=axis, keepdims=True)
        return topi.divide(topi.fast_exp(topi.subtract(data, m)), s)
    return bb.call_te(f, x, primfunc_name_hint="softmax")


def _fast_sigmoid(x: Any) -> Any:
    """1 / (1 + exp(-x)) with topi's polynomial exp: a per-frame sigmoid head over a GRU's 300 x 257
    outputs was a third of the head kernel's time as scalar libm calls.  fast_exp clamps its argument to
    [-88.4, 88.4], so far below -88 this gives ~4e-39 instead of ~0: both round to 0 next to any other
    term."""
    one = tvm.tirx.const(1.0, "float32")
    return topi.divide(one, topi.add(one, topi.fast_exp(topi.negative(x))))


def legalize_map() -> dict[str, Callable[[Any, Any], Any]]:
    return {
        "relax.sigmoid": _unary(_fast_sigmoid, "sigmoid"),
        "relax.erf": _unary(topi.fast_erf, "erf"),
        "relax.exp": _unary(topi.fast_exp, "exp"),
        "relax.tanh": _unary(topi.fast_tanh, "tanh"),
        "relax.nn.softmax": _softmax,
    }
