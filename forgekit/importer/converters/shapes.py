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
        ty = getattr(inputs[1], "ty", None)
        if (target is None and isinstance(ty, relax.TensorType) and ty.ndim == 1
                and isinstance(ty.shape, relax.ShapeExpr)
                and isinstance(ty.shape.values[0], tvm.tirx.IntImm)
                and isinstance(getattr(getattr(data, "ty", None), "shape", None), relax.ShapeExpr)):
            return _reshape_to_values(bb, data, inputs[1], int(ty.shape.values[0]), bool(attr.get("allowzero", 0)))
        return super()._impl_v13(bb, inputs, attr, params)


def _reshape_to_values(bb, data, target, rank: int, allowzero: bool):
    """``Reshape(x, t)`` where ``t`` holds values known at run time only (``Concat(Shape(h)[:1], [2, 2])`` of a
    tensor ``h`` sliced by a value): TVM's converter wants a shape there ("Reshape requires the input new shape to
    be Shape").  ONNX's 0 (copy the input's extent) and -1 (the rest) are resolved in int64 tensor arithmetic, and
    the result's extents become symbols bound at run time."""
    op = relax.op
    i64 = lambda v: relax.const(v, "int64")  # noqa: E731
    t = bb.normalize(op.astype(target, "int64"))
    dims = bb.normalize(op.shape_to_tensor(op.shape_of(data)))
    if not allowzero and 0 < rank <= int(data.ty.ndim):
        head = bb.normalize(op.strided_slice(dims, axes=[0], begin=[0], end=[rank]))
        t = bb.normalize(op.where(op.equal(t, i64(0)), head, t))
    known = op.prod(op.where(op.equal(t, i64(-1)), i64(1), t))
    t = bb.normalize(op.where(op.equal(t, i64(-1)), op.floor_divide(op.prod(dims), known), t))
    shape = bb.emit(op.tensor_to_shape(t))
    symbols = [tvm.tirx.Var(f"reshape_{i}", "int64") for i in range(rank)]
    bb.match_cast(shape, relax.ShapeType(symbols))
    # the element counts must agree, or the reshape reads past the data (a target of 5x5 for 12 values read 13
    # floats beyond them): the flat data is matched against the target's count, which the VM checks at run time
    total = 1
    for dim in data.ty.shape.values:
        total = total * dim
    count = 1
    for symbol in symbols:
        count = count * symbol
    flat = bb.match_cast(bb.normalize(op.reshape(data, relax.ShapeExpr([total]))),
                         relax.TensorType([count], data.ty.dtype))
    return op.reshape(flat, relax.ShapeExpr(symbols))


def _shape_behind(bb, expr):
    """The ``ShapeExpr`` a 1-D int64 tensor was made from (``shape_to_tensor``, through reshapes), or None."""
    for _ in range(4):
        if isinstance(expr, relax.ShapeExpr):
            return expr
        bound = bb.lookup_binding(expr) if isinstance(expr, relax.Var) else expr  # converters return calls
        if not (isinstance(bound, relax.Call) and isinstance(bound.op, tvm.ir.Op)
                and bound.op.name in ("relax.reshape", "relax.shape_to_tensor")):
            return None
        expr = bound.args[0]
    return None


class Tile(_fe.Tile):
    """``Tile`` with repeats read off a shape (a class token tiled to the batch: ``Concat(Shape(x)[:1], [1, 1])``).
    The repeats arrive as a tensor (``prepare._tile_repeats_as_tensors``: TVM's frontend refuses a shape there),
    and TVM tiled by them at run time into fresh extents that no later shape could be proven equal to (the
    Concat with ``x`` could not be lowered).  Where the tensor was made from a shape, its values tile
    symbolically: ``x[1, 1, 4]`` by ``[N, 1, 1]`` is ``[N, 1, 4]``."""

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        data, reps = inputs[0], _shape_behind(bb, inputs[1])
        shape = getattr(getattr(data, "ty", None), "shape", None)
        if reps is None or not isinstance(shape, relax.ShapeExpr) or len(reps.values) != len(shape.values):
            return super()._impl_v13(bb, inputs, attr, params)
        dims, counts = list(shape.values), list(reps.values)
        # tile = broadcast each axis to [count, extent], then merge the two: x[d0, d1] -> [r0, d0, r1, d1]
        spread = relax.op.reshape(data, relax.ShapeExpr([v for d in dims for v in (1, d)]))
        wide = relax.op.broadcast_to(spread, relax.ShapeExpr([v for r, d in zip(counts, dims) for v in (r, d)]))
        return relax.op.reshape(wide, relax.ShapeExpr([r * d for r, d in zip(counts, dims)]))


CONVERTERS = {"Cast": Cast, "Range": Range, "Concat": Concat, "Equal": Equal, "Gather": Gather,
              "Reshape": Reshape, "Tile": Tile}
