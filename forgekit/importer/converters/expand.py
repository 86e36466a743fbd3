"""ONNX Expand on symbolic dimensions, by ONNX's broadcasting rule, one dimension at a time.

TVM 0.27's converter reads ``dim.value`` of every input dimension when the target shape is a constant, so
torch's ``x.expand(-1, 4, 8)`` on ``x[N, 1, 8]`` (exported as ``Expand(x, [1, 4, 8])``: torch writes -1 as 1)
fails to import ("'Var' object has no attribute 'value'"); and a target it cannot read as shape values is
turned into fresh symbols (``x_0, x_1...``) that no later shape can be proven equal to.  Here each output
dimension follows ONNX's rule: a target 1 (or TVM's -1, "keep") keeps the input's, an input 1 takes the
target's, equal dimensions stay, and where one side is symbolic the other side's static size is the result
(broadcasting allows only 1 or that size there, which the kernel checks at run time).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _fe

from .shapes import shape_values


def _static(dim) -> int | None:
    if isinstance(dim, int):
        return dim
    return int(dim.value) if isinstance(dim, tvm.tirx.IntImm) else None


def expanded_dim(have, want):
    """The output extent of one dimension: ``have`` (the input's) broadcast against ``want`` (the target's)."""
    h, w = _static(have), _static(want)
    if w in (1, -1):
        return have
    if h == 1:
        return want
    if h is not None and w is not None:
        if h != w:
            raise ValueError(f"Expand cannot broadcast a dimension of size {h} to {w}")
        return have
    if h is None and w is None and not tvm_ffi.structural_equal(have, want):
        # two different symbols: ONNX gives the larger (the other must be 1); known only at run time
        return tvm.tirx.max(have, want)
    return have if h is not None or w is None else want


class Expand(_fe.Expand):
    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        data, shape = inputs
        target = shape_values(shape, params)
        if target is None or not isinstance(getattr(data.ty, "shape", None), relax.ShapeExpr):
            return super()._impl_v13(bb, inputs, attr, params)
        have = list(data.ty.shape.values)
        rank = max(len(have), len(target))
        have = [1] * (rank - len(have)) + have
        target = [1] * (rank - len(target)) + list(target)
        out = [expanded_dim(h, w) for h, w in zip(have, target)]
        if rank == int(data.ty.ndim) and all(tvm_ffi.structural_equal(tvm.tirx.IntImm("int64", o) if isinstance(o, int)
                                                                      else o, h) for o, h in zip(out, data.ty.shape.values)):
            return data
        return relax.op.broadcast_to(data, relax.ShapeExpr(out))


CONVERTERS = {"Expand": Expand}
