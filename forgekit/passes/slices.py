"""Exact ``strided_slice`` on symbolic dimensions: used by the importer's Slice converter (so every later
converter sees exact shapes) and by :mod:`.canonicalize` (slices made by other means).

Axes that keep the whole axis (begin 0, end at or past the dimension: ONNX's ``INT64_MAX`` "to the end",
Keras' ``Cropping`` on the batch axis) are dropped, the other bounds are clamped the way ONNX clamps them,
with ``end >= begin``, as explicit in-bound expressions, and full reversals (``x[::-1]``, step -1 from
``-1`` to ``INT64_MIN``) become ``flip``.  TVM's own shape arithmetic gets these wrong: an end of
``INT64_MAX`` gives ``T.min(9223372036854775807, N)``, which its simplifier cannot reduce (INT64_MAX is its
+infinity), so passes that re-derive shapes (``ConvertLayout`` at opt level 3) disagree with the bindings
("DataflowBlock Pass should not rewrite or delete any global-scope Var"), a matmul schedule's write-back
gets an always-false predicate (uninitialized output: a silent wrong answer), the memory planner sizes
buffers for 2**31 rows (``std::bad_alloc``), and converters after the slice cannot prove the extent
equal to ``N`` (Squeeze, Reshape, broadcasting, Pad: import errors); ``x[1:-1]`` on ``N = 1`` gets the
length ``min(max(N - 1, 0), N) - min(1, N) = -1``; ``INT64_MIN`` ends overflow.  Found by
``forgekit.testing``; regression models in ``tests/assets/fuzz/``.

Why not TVM's passes: ``relax.transform`` has no pass that bounds shape variables (``tir`` var bounds are
only attached per PrimFunc), and ``ONNX``-level simplifiers (onnxslim, onnxscript's optimizer) keep the
``INT64_MAX`` ends: they are valid ONNX, the problem is only in TVM's shape arithmetic.
"""

from __future__ import annotations

from typing import Any

import tvm
import tvm_ffi
from tvm import relax

#: a slice bound at or beyond this means "to the end of the axis" on a symbolic dimension.  Exporters spell
#: "to the end" as INT64_MAX (torch), INT32_MAX (tf2onnx's end masks) or 10**9 (jax2tf's ``end_masked``, as
#: in Google's Magika file-type classifier); clamping to ``min(10**9, N)`` keeps an extent no later
#: converter can prove equal to ``N``.  The cost is assuming no symbolic dimension reaches 10**9 (4 GB of
#: float32 along one axis); static dimensions keep ONNX's exact clamping.
HUGE_END = 10**9

def _int(value: Any) -> int | None:
    value = getattr(value, "value", value)
    return int(value) if isinstance(value, (int, tvm.tirx.IntImm)) else None


def _clamp(index: Any, dim: Any) -> Any:
    """ONNX's clamping of a slice bound (step > 0) into [0, dim]: an int for a static dim and bound, else a
    PrimExpr; None for a symbolic bound whose sign is unknown (negative bounds count from the end)."""
    size = _int(dim)
    if not isinstance(index, int):
        sign = _sign(index)
        if sign is None:
            return None
        dim = tvm.tirx.IntImm("int64", size) if size is not None else dim
        return tvm.tirx.max(dim + index, tvm.tirx.IntImm("int64", 0)) if sign < 0 else tvm.tirx.min(index, dim)
    if size is not None:
        return max(0, min(index + size if index < 0 else index, size))
    if index >= HUGE_END:
        return dim
    if index <= -HUGE_END:
        return 0
    if index >= 0:
        return tvm.tirx.min(tvm.tirx.IntImm("int64", index), dim)
    return tvm.tirx.max(dim + tvm.tirx.IntImm("int64", index), tvm.tirx.IntImm("int64", 0))


def _sign(value: Any) -> int | None:
    """-1 / +1 where a symbolic slice bound is provably negative / non-negative (every shape variable at
    least 1), else None.  ``x[:, -L:]`` (HF T5's ``position_bias[:, :, -seq_length:, :]``, with ``L`` read
    off another tensor's shape of the same length) has the bound ``-L``: negative, so it counts from the end,
    and its clamp ``max(L - L, 0)`` is 0 (TVM's slice took ``-L`` as in range: ``L + INT64_MAX`` long)."""
    analyzer = _analyzer(value)
    if analyzer.can_prove(value < 0):
        return -1
    if analyzer.can_prove(value >= 0):
        return 1
    return None


def _unproven(*values: Any) -> bool:
    """Whether a simplified slice bound still holds the ``min``/``max`` of its clamp (it was not proven)."""
    return any(isinstance(v, (tvm.tirx.Min, tvm.tirx.Max)) for v in values)


def _analyzer(value: Any) -> Any:
    analyzer = tvm.sym.Analyzer()
    for var in tvm.tirx.analysis.undefined_vars(value):
        analyzer.update(var, tvm.sym.ConstIntBound(1, HUGE_END))
    return analyzer


def _bound(value: Any) -> Any:
    """A slice bound as an int, or as the PrimExpr of a symbolic one (a ``PrimValue`` of the shape)."""
    number = _int(value)
    if number is not None:
        return number
    value = getattr(value, "value", value)
    return value if isinstance(getattr(value, "ty", None), tvm.ir.PrimType) else None


def _max(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    if isinstance(a, int):
        a = tvm.tirx.IntImm("int64", a)
    if isinstance(b, int):
        b = tvm.tirx.IntImm("int64", b)
    if tvm_ffi.structural_equal(a, b):
        return a
    return tvm.tirx.max(a, b)


def _simplify(value: Any) -> Any:
    """``value`` simplified knowing every shape variable is at least 1 (a tensor dimension of a real input;
    ``x[0:1]`` on ``N`` is then 1 long, not ``min(1, N)``, which later broadcasting cannot resolve)."""
    if isinstance(value, int):
        return value
    out = _analyzer(value).simplify(value)
    return _int(out) if _int(out) is not None else out


def _prim(value: Any) -> Any:
    return value if isinstance(value, int) else relax.prim_value(value)


def _full_reversal(begin: int, end: int, stride: int) -> bool:
    """``x[::-1]`` as exporters spell it: step -1 from the last element (-1 or "INT64_MAX") to before the
    first (``INT64_MIN`` / ``-INT64_MAX``)."""
    return stride == -1 and (begin == -1 or begin >= HUGE_END) and end <= -HUGE_END


def exact_strided_slice(call: Any) -> Any:
    """``call`` (a ``strided_slice``) made exact on its symbolic dimensions and bounds, or None (not a
    strided_slice, nothing symbolic sliced, a symbolic bound of unknown sign, a negative step on a symbolic
    dimension that is not a full reversal)."""
    if call.op.name != "relax.strided_slice":
        return None
    data_ty = call.args[0].ty
    if getattr(data_ty, "shape", None) is None or not hasattr(data_ty.shape, "values"):
        return None
    dims = list(data_ty.shape.values)
    axes, begins, ends = (list(getattr(a, "fields", a)) for a in call.args[1:4])
    strides = list(getattr(call.args[4], "fields", call.args[4])) if len(call.args) > 4 else [1] * len(axes)
    parsed = [(_int(a), _bound(b), _bound(e), _int(st)) for a, b, e, st in zip(axes, begins, ends, strides)]
    if any(None in item for item in parsed):
        return None
    # symbolic: a symbolic dimension, or a symbolic bound (x[:, -L:], mask[..., :L] with L another tensor's)
    symbolic = [_int(dims[a % len(dims)]) is None or not isinstance(b, int) or not isinstance(e, int)
                for a, b, e, _ in parsed]
    if not any(symbolic):
        return None  # TVM's own arithmetic is exact on static dims and bounds
    if any(st <= 0 and not (isinstance(b, int) and isinstance(e, int) and _full_reversal(b, e, st))
           for (_, b, e, st), sym in zip(parsed, symbolic) if sym):
        return None  # other negative steps on symbolic axes are left to TVM
    data = call.args[0]
    for (axis, begin, end, stride), sym in zip(parsed, symbolic):
        if sym and stride < 0:
            data = relax.op.flip(data, axis % len(dims))
    static = [item for item, sym in zip(parsed, symbolic) if not sym]
    if static:  # static axes (any step) keep TVM's exact arithmetic, in a slice of their own
        data = relax.op.strided_slice(data, *(list(part) for part in zip(*static)))
    parsed = [item for item, sym in zip(parsed, symbolic) if sym]
    keep: list[tuple[int, Any, Any, int]] = []
    for axis, begin, end, stride in parsed:
        if stride < 0:
            continue  # a reversal, done above
        dim = dims[axis % len(dims)]
        if begin == 0 and stride == 1 and isinstance(end, int) and end >= HUGE_END:
            continue  # the whole axis: no slicing at all
        lo, hi = _clamp(begin, dim), _clamp(end, dim)
        if lo is None or hi is None:
            return None  # a symbolic bound of unknown sign: TVM's slice
        lo, hi = _simplify(lo), _simplify(_max(hi, lo))
        if not (isinstance(begin, int) and isinstance(end, int)) and _unproven(lo, hi):
            # a symbolic bound whose clamp does not simplify (``table[:, :L]`` on a static 512: ``min(L, 512)``):
            # TVM's slice, which takes the bound as in range.  The exact extent would be right, but no later
            # op could prove it equal to ``L``: a BERT-style position table added to [B, L, C] then failed to
            # import where TVM's slice had imported (and matched onnxruntime) at every L up to 512
            return None
        keep.append((axis, lo, hi, stride))
    if not keep:
        return data
    axes_, begins_, ends_, strides_ = (list(part) for part in zip(*keep))
    return relax.op.strided_slice(data, axes_, [_prim(b) for b in begins_], [_prim(e) for e in ends_],
                                  strides_, assume_inbound=True)
