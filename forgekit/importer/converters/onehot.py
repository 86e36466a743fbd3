"""ONNX OneHot whose ``depth`` is a one-element rank-1 tensor or a float, as the spec allows.

TVM 0.27's converter passes ``depth.tolist()`` straight to ``relax.op.one_hot``, which wants an ``int``:
a rank-1 ``[5]`` (what a file-type classifier from PyPI ships) fails with "Expected `int` but got
`ffi.Array`", a float depth with a similar error.  The spec says depth is "Scalar or rank 1 tensor
containing exactly one element" of any numeric type, cast to an integer; here it is made a 0-d int64
constant before TVM's converter runs.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _fe


class OneHot(_fe.OneHot):
    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        depth = _fe.get_constant(inputs[1], params)
        if isinstance(depth, tvm.ir.GenericConst):
            value = np.asarray(depth.value.numpy())
            if value.size != 1:
                raise ValueError(f"OneHot depth must hold exactly one value, got shape {list(value.shape)}")
            inputs = [inputs[0], relax.const(np.int64(value.reshape(-1)[0]), "int64"), *list(inputs)[2:]]
        return super()._impl_v11(bb, inputs, attr, params)


CONVERTERS = {"OneHot": OneHot}
