"""ONNX OneHot whose ``depth`` is a one-element rank-1 tensor or a float, as the spec allows.

TVM 0.27's converter passes ``depth.tolist()`` straight to ``relax.op.one_hot``, which wants an ``int``:
a rank-1 ``[5]`` (what a file-type classifier from PyPI ships) fails with "Expected `int` but got
`ffi.Array`", a float depth with a similar error.  The spec says depth is "Scalar or rank 1 tensor
containing exactly one element" of any numeric type, cast to an integer; here it is made a 0-d int64
constant before TVM's converter runs.  The off/on values keep their own dtype (TVM's converter made them
float64).
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
        values = _fe.get_constant(inputs[2], params)
        if isinstance(values, tvm.ir.GenericConst) and isinstance(_fe.get_constant(inputs[1], params),
                                                                   tvm.ir.GenericConst):
            # TVM's converter makes the off/on values Python floats, i.e. float64 prim values: a float32
            # one-hot came out float64 and the Concat after it failed (paddle2onnx's SLANet decoder)
            array = values.value.numpy()
            dtype = str(array.dtype)
            off, on = (relax.prim_value(tvm.tirx.const(v, dtype)) for v in array.reshape(-1).tolist())
            depth = int(_fe.get_constant(inputs[1], params).value.numpy().reshape(-1)[0])
            indices = inputs[0]
            extent = relax.const(depth, str(indices.ty.dtype))
            indices = _fe._normalize_negative_indices(bb, indices, extent)
            return relax.op.one_hot(indices, on, off, depth, attr.get("axis", -1))
        return super()._impl_v11(bb, inputs, attr, params)


CONVERTERS = {"OneHot": OneHot}
