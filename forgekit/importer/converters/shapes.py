"""Shape arithmetic that stays shape arithmetic on symbolic dimensions.

TVM's frontend carries an ONNX ``Shape`` result as a ``relax.ShapeExpr`` (values ``1, 3, 48, W``), and its
Slice, Gather, Concat, Unsqueeze and Reshape converters compute on ShapeExprs directly.  Exporters such
as paddle2onnx put ``Cast(to=int32)`` ... ``Cast(to=int64)`` around every shape computation; TVM's Cast
turns a symbolic ShapeExpr into a runtime int32 tensor, after which ``Reshape`` fails with "Reshape
requires the input new shape to be Shape" (PP-OCRv4 rec with a dynamic width).  An integer Cast of a
ShapeExpr is the identity on its values, so it keeps the ShapeExpr; a float Cast still makes a tensor.

``Range(0, S, 1)`` on a symbolic ``S`` (position ids: ``arange(input_ids.shape[1])`` in every BERT export)
is computed by TVM with runtime tensors, so its length, and that of everything downstream, is unknown
("shape_of expects a tensor input" at the next Shape/Gather).  With integer constants for start and step
and a symbolic limit it becomes ``relax.op.arange``, whose length is ``S``.

tf2onnx / jax2tf exports concatenate a sliced shape with int32 constants (magika, basic-pitch), which TVM's
Concat only takes as shape values when they are int64: it keeps the ShapeExpr here.  (An ``Identity`` on a
shape, which TVM's frontend refuses before any converter runs, is bypassed before import:
``prepare._bypass_identities``.)  A scalar taken out of a shape (``Squeeze``
of a one-element slice) reshaped to ``[1]`` becomes a one-element ShapeExpr again, not a failed tensor
Reshape (PP-OCRv6 rec).
"""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _fe


class Cast(_fe.Cast):
    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        if isinstance(inputs[0], relax.ShapeExpr) and _fe.get_type(attr["to"]).startswith("int"):
            return inputs[0]
        return super()._impl_v13(bb, inputs, attr, params)


def _int_scalar(x, params):
    """A Python int for an integer constant of one element, the expression for an integer PrimExpr, else None."""
    x = _fe.get_constant(x, params)
    if isinstance(x, tvm.ir.GenericConst):
        value = x.value.numpy()
        return int(value.reshape(-1)[0]) if value.size == 1 and value.dtype.kind in "iu" else None
    if tvm.ir.is_prim_expr(x) and "int" in str(getattr(x, "dtype", None) or x.ty):
        return x
    return None


def _integral_scalar(x, params):
    """:func:`_int_scalar`, also for float values known to be integers: a float constant with an integral
    value, and ``Cast(float, n)`` of an integer PrimExpr (``float(w)`` of a shape, as YOLOv8's anchor grid
    ``Range(0.0, float(w), 1.0)`` has it)."""
    value = _int_scalar(x, params)
    if value is not None:
        return value
    x = _fe.get_constant(x, params)
    if isinstance(x, tvm.ir.GenericConst):
        v = x.value.numpy()
        if v.size == 1 and v.dtype.kind == "f" and float(v.reshape(-1)[0]).is_integer():
            return int(v.reshape(-1)[0])
    elif isinstance(x, tvm.tirx.Cast) and "int" in str(x.value.ty):
        return x.value
    return None


class Range(_fe.Range):
    """Range over a symbolic length keeps that length (``arange(0, W)`` is ``W`` long), in integers or, when
    every bound is an integer value, in floats; TVM's converter computes the length with tensor ops, so the
    result has a data-dependent length no later shape can be proven equal to."""

    @classmethod
    def _impl_v12(cls, bb, inputs, attr, params):
        start, limit, delta = (_integral_scalar(x, params) for x in inputs[:3])
        if isinstance(start, int) and isinstance(delta, int) and delta > 0 and tvm.ir.is_prim_expr(limit) \
                and not isinstance(limit, int):
            dtype = str(_fe.get_constant(inputs[0], params).ty.dtype)
            return relax.op.arange(start, limit, delta, dtype=dtype)
        return super()._impl_v12(bb, inputs, attr, params)


def shape_values(x, params):
    """The values of a ShapeExpr or of a rank-0/1 integer constant, else None."""
    if isinstance(x, relax.ShapeExpr):
        return list(x.values)
    x = _fe.get_constant(x, params)
    if isinstance(x, tvm.ir.GenericConst):
        value = x.value.numpy()
        if value.ndim <= 1 and value.dtype.kind in "iu":
            return [int(v) for v in value.reshape(-1)]
    return None


class Concat(_fe.Concat):
    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        if any(isinstance(x, relax.ShapeExpr) for x in inputs):
            parts = [shape_values(x, params) for x in inputs]
            if all(p is not None for p in parts):
                return relax.ShapeExpr([v for p in parts for v in p])
        return super()._impl_v13(bb, inputs, attr, params)


def _known_equal(a, b) -> bool | None:
    """``a == b`` for two shape values when it is known at import time: a symbolic dimension is at least 1
    (forgekit's ranges start at 1), so never 0 nor negative."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if tvm_ffi.structural_equal(a, b):
        return True
    if isinstance(a, int) and a < 1 or isinstance(b, int) and b < 1:
        return False
    return None


class Equal(_fe.Equal):
    """``Equal(shape, -1)`` (torch's ``expand(-1, ...)`` with traced sizes: ``Where(Equal(size, -1), 1, size)``)
    is known at import time: a dimension is never negative.  TVM's converter takes no scalar here; a
    comparison with a positive size it cannot know is left to it (one-dimensional) or a runtime tensor."""

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        if any(isinstance(x, relax.ShapeExpr) for x in inputs):
            lhs, rhs = (_values(x, params) for x in inputs)
            if lhs is not None and rhs is not None and (len(lhs) == len(rhs) or 1 in (len(lhs), len(rhs))):
                n = max(len(lhs), len(rhs))
                known = [_known_equal(a, b) for a, b in zip(lhs * n if len(lhs) == 1 else lhs,
                                                            rhs * n if len(rhs) == 1 else rhs)]
                if None not in known:
                    return relax.const(np.array(known, bool), "bool")
                if len(lhs) == len(rhs) and all(isinstance(x, relax.ShapeExpr) or x.ty.ndim == 1 for x in inputs):
                    # ``N == 2``: TVM's answer (structural, so False) as before; a runtime tensor here would
                    # turn the Where/Reshape after it into a runtime shape that later imports cannot use
                    return super()._impl_v13(bb, inputs, attr, params)
            inputs = [bb.normalize(relax.op.shape_to_tensor(x)) if isinstance(x, relax.ShapeExpr) else x
                      for x in inputs]
            return relax.op.equal(*inputs)
        return super()._impl_v13(bb, inputs, attr, params)


def _values(x, params) -> list | None:
    """:func:`shape_values`, with Python ints for static entries (and a 0-d constant as one value)."""
    values = shape_values(x, params)
    return None if values is None else [int(v) if isinstance(v, (int, tvm.tirx.IntImm)) else v for v in values]


class Gather(_fe.Gather):
    """A one-dimensional constant index into a shape keeps a ShapeExpr (``Gather(Shape(s), [1])`` is ``[S]``);
    TVM's converter keeps only a 0-d index as a value and gathers from a runtime tensor otherwise, after
    which an Expand or Reshape to the result gets fresh symbols no later shape can match."""

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        data, index = inputs[0], _fe.get_constant(inputs[1], params)
        if isinstance(data, relax.ShapeExpr) and isinstance(index, tvm.ir.GenericConst):
            value = index.value.numpy()
            if value.ndim == 1 and value.dtype.kind in "iu" and all(-len(data) <= int(i) < len(data) for i in value):
                return relax.ShapeExpr([data.values[int(i)] for i in value])
        return super()._impl_v13(bb, inputs, attr, params)


class Reshape(_fe.Reshape):
    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        data = inputs[0]
        target = shape_values(inputs[1], params) if not isinstance(inputs[1], relax.ShapeExpr) else None
        if tvm.ir.is_prim_expr(data) and not isinstance(data, relax.ShapeExpr) and target is not None:
            if target == []:
                return data
            if len(target) == 1 and target[0] in (1, -1):
                return relax.ShapeExpr([data])
        return super()._impl_v13(bb, inputs, attr, params)


CONVERTERS = {"Cast": Cast, "Range": Range, "Concat": Concat, "Equal": Equal, "Gather": Gather,
              "Reshape": Reshape}
