"""ONNX Slice with exact shapes on symbolic dimensions.

TVM's converter is used as is; its ``strided_slice`` is then rewritten by
:func:`forgekit.passes.slices.exact_strided_slice` *here*, at import, so the converters after it see the
exact extent (``N``, ``N - 1``) instead of ``T.min(INT64_MAX, N)``: fixing it only after the import (as a
pass) leaves Squeeze, Reshape, Pad, broadcasting and pooling converters failing on the unprovable extent.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.ir import Op
from tvm.relax.frontend.onnx import onnx_frontend as _fe

from ...passes.slices import exact_strided_slice


class Slice(_fe.Slice):
    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        out = super()._impl_v13(bb, inputs, attr, params)
        if isinstance(out, relax.Call) and isinstance(out.op, Op):
            exact = exact_strided_slice(out)
            if exact is not None:
                return exact
        return _value_bounded(bb, out, inputs, params)


def _value_bounded(bb, out, inputs, params):
    """A Slice whose bounds are tensor values (``x[:n]``) comes out of TVM with its rank only: the axes it does
    not cut keep the input's extents here, and each cut one becomes a symbol bound at run time (``match_cast``).
    Fresh symbols on every axis (what the import does for any rank-only tensor) left ``x[:n] + b`` with
    ``[d0, d1]`` against ``[d0, 4]``, which no later shape can prove equal."""
    out = bb.normalize(out) if isinstance(out, relax.Expr) else out
    ty, data_ty = getattr(out, "ty", None), getattr(inputs[0], "ty", None)
    if not (isinstance(ty, relax.TensorType) and ty.shape is None and ty.ndim > 0
            and isinstance(getattr(data_ty, "shape", None), relax.ShapeExpr)):
        return out
    rank = ty.ndim
    axes = _fe.get_constant(inputs[3], params) if len(inputs) > 3 and inputs[3] is not None else None
    if axes is None:
        cut = set(range(rank))
    elif isinstance(axes, tvm.ir.GenericConst):
        cut = {int(a) % rank for a in axes.value.numpy().ravel()}
    else:
        return out
    extents = [tvm.tirx.Var(f"slice_{i}", "int64") if i in cut else data_ty.shape.values[i] for i in range(rank)]
    return bb.match_cast(out, relax.TensorType(extents, ty.dtype))


CONVERTERS = {"Slice": Slice}
