"""Custom legalizations: vectorizable polynomial exp / erf / tanh / sigmoid (topi.fast_*) instead of scalar
libm calls, and a softmax built from them.  `erf` in the BERT GELU epilogue was 8x the cost of the
matmul it is fused into before this (libm erff is a scalar call that blocks vectorization)."""

from __future__ import annotations

from typing import Any, Callable

import tvm
from tvm import te, topi
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
    """``softmax`` / ``log_softmax`` with the polynomial exp, computed once per element.

    TOPI's softmax (and our earlier one) computed ``exp(x - max)`` twice, once for the sum and once for the
    normalization, and divided every element by the sum; TOPI's log_softmax calls libm's scalar ``expf``.
    Here ``e = exp(x - max)`` is a stage of its own, which :class:`.rules.reduction.ReductionRule` keeps as one
    row in cache (it inlines only cheap producers), and the normalization multiplies by ``1 / sum``, as
    onnxruntime's MLAS kernel does.  A row padded to whole vectors reads its tail through a clamped Select:
    ``topi.nn.pad``'s if_then_else kept the padded reads from vectorizing.  Measured alone (2 threads, AVX-512,
    one kernel; tests/unit/test_softmax_rows.py): [40, 6625] 0.68 -> 0.17 ms (onnxruntime 0.105), [40, 16000]
    0.50 -> 0.39 (0.28), [1536, 128] 0.17 -> 0.11 (0.08).
    """
    x = call.args[0]
    if str(x.ty.dtype) != "float32":
        return _default(bb, call)
    ndim = len(x.ty.shape.values)
    axis = int(call.attrs.axis)
    axis = axis + ndim if axis < 0 else axis
    log = call.op.name == "relax.nn.log_softmax"

    shape = x.ty.shape.values
    length = shape[axis] if axis == ndim - 1 else None
    pad = (-int(length)) % ROW_MULTIPLE if isinstance(length, tvm.tirx.IntImm) and int(length) >= 4 * ROW_MULTIPLE \
        else 0

    def f(data: Any) -> Any:
        # a row whose length is not a multiple of the vector lanes (a CTC head's 6625 classes) is reduced over a
        # copy padded with the lowest float: exp(lowest - max) underflows to ~0, and the row reduction rule can
        # then split it into whole vectors (it reduced 6625 scalars one at a time: PP-OCRv4 rec's 40 x 6625
        # softmax 1.04 -> 0.3 ms alone), which also keeps every lane's partial sum <= 2^14 terms for rows up to
        # 2^16 at 4 lanes (what lets forgekit.LongReductions leave them whole at level 3); the pad is a Select
        # of a clamped (in-bounds) read, inlined into the reductions
        if pad:
            last = data.shape[-1]
            src = te.compute([*data.shape[:-1], last + pad], lambda *i: tvm.tirx.Select(
                i[-1] < last, data(*i[:-1], tvm.te.min(i[-1], last - 1)), tvm.tirx.const(LOWEST, "float32")),
                name="PadInput")
        else:
            src = data
        m = topi.max(src, axis=axis, keepdims=True)
        shifted = topi.subtract(src, m)
        e = topi.fast_exp(shifted)
        s = topi.sum(e, axis=axis, keepdims=True)
        if log:
            return topi.subtract(topi.subtract(data, m), topi.log(s))
        inv = topi.divide(tvm.tirx.const(1.0, "float32"), s)
        if pad:
            return te.compute(data.shape, lambda *i: e(*i) * inv(*i[:-1], 0), name="T_softmax_norm")
        return topi.multiply(e, inv)
    return bb.call_te(f, x, primfunc_name_hint="log_softmax" if log else "softmax")


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
        "relax.nn.log_softmax": _softmax,
    }


def legalize_round(bb: Any, call: Any) -> Any:
    """``relax.round`` of floats: half to even, as topi's, but as the LLVM intrinsic call itself.  topi's round
    is ``tirx.nearbyint``, which TVM 0.27 does not mark ``TVectorizable`` (``tirx.round`` and ``tirx.floor``
    are), so VectorizeLoop scalarized every loop that rounds, and the kernel it fused into with it: the output
    transform of an int8 conv on fp32 Winograd (:mod:`.int8_winograd`) ran its epilogue one element at a time.
    Not by marking the op vectorizable: that attribute is process-wide, and the CUDA codegen lowers the op to a
    scalar libdevice call."""
    x = call.args[0]
    dtype = str(x.ty.dtype)
    if dtype not in ("float32", "float64"):
        return _default(bb, call)

    def f(t: Any) -> Any:
        return te.compute(t.shape, lambda *i: tvm.tirx.call_llvm_pure_intrin(dtype, "llvm.nearbyint", t(*i)),
                          name="round")
    return bb.call_te(f, x, primfunc_name_hint="round")
