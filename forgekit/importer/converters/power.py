"""ONNX Pow with an exponent of another type than its base.

ONNX lets the exponent's type differ (``T1``: any int or float type), as torch exports ``x ** 3`` with an
int64 exponent; TVM's converter hands both to ``relax.power``, which refuses mixed types ("Binary operators
must have the same datatype for both operands"), so such a model did not import (exit 4).  A float base
takes the exponent in its own type, as onnxruntime computes it; a constant exponent stays a constant, so
``x ** 2`` and ``x ** 3`` still become products (:mod:`forgekit.passes.canonicalize`).
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _fe


class Pow(_fe.Pow):
    @classmethod
    def _impl_v7(cls, bb, inputs, attr, params):
        base, exponent = inputs[0], inputs[1]
        dtype = str(getattr(getattr(base, "ty", None), "dtype", ""))
        other = str(getattr(getattr(exponent, "ty", None), "dtype", ""))
        if dtype.startswith(("float", "bfloat")) and other and other != dtype:
            if isinstance(exponent, tvm.ir.expr.Constant):
                exponent = relax.const(exponent.value.numpy().astype(dtype), dtype)
            else:
                exponent = relax.op.astype(exponent, dtype)
            inputs = [base, exponent]
        return super()._impl_v7(bb, inputs, attr, params)


CONVERTERS = {"Pow": Pow}
