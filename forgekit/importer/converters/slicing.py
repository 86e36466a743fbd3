"""ONNX Slice with exact shapes on symbolic dimensions.

TVM's converter is used as is; its ``strided_slice`` is then rewritten by
:func:`forgekit.passes.slices.exact_strided_slice` *here*, at import, so the converters after it see the
exact extent (``N``, ``N - 1``) instead of ``T.min(INT64_MAX, N)``: fixing it only after the import (as a
pass) leaves Squeeze, Reshape, Pad, broadcasting and pooling converters failing on the unprovable extent.
"""

from __future__ import annotations

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
        return out


CONVERTERS = {"Slice": Slice}
