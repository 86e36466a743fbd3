"""Fold constant-only Relax calls with numpy right after import.

``from_onnx`` leaves many calls on constants (``reshape(bias)``, weight
``astype``/``subtract(zero_point)``, ``permute_dims(W)`` ...).  The default
pipeline's ``FoldConstant`` evaluates each one by JIT-compiling a kernel, which
was 3.4 s of the 9.8 s compile of the PP-OCR classifier.  Doing the simple ones
in numpy here is exact (same dtype arithmetic) and nearly free.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

MAX_ELEMENTS = 1 << 24

# IEEE-exact (correctly rounded) ops only, so numpy gives TVM's bits
_BINARY = {
    "relax.add": np.add,
    "relax.subtract": np.subtract,
    "relax.multiply": np.multiply,
    "relax.maximum": np.maximum,
    "relax.minimum": np.minimum,
    "relax.equal": np.equal,
    "relax.less": np.less,
    "relax.greater": np.greater,
}
_UNARY = {"relax.isnan": np.isnan, "relax.isinf": np.isinf, "relax.negative": np.negative, "relax.sqrt": np.sqrt}


def _int_list(vals):
    out = []
    for v in vals:
        if isinstance(v, tvm.tirx.IntImm):
            out.append(int(v.value))
        elif isinstance(v, int):
            out.append(v)
        else:
            return None
    return out


@mutator
class _NumpyFold(PyExprMutator):
    def _const(self, e):
        if isinstance(e, relax.Var):
            b = self.lookup_binding(e)
            if b is not None:
                e = b
        if isinstance(e, tvm.ir.expr.GenericConst):
            return e.value.numpy()
        return None

    def visit_call_(self, call):
        call = super().visit_call_(call)
        op = call.op
        if not isinstance(op, tvm.ir.Op) or not isinstance(call.ty, relax.TensorType):
            return call
        name = op.name
        try:
            res = self._eval(name, call)
        except Exception:  # noqa: BLE001 - leave it to FoldConstant
            res = None
        if res is None:
            return call
        dtype = str(call.ty.dtype)
        res = np.asarray(res)
        if res.size > MAX_ELEMENTS:
            return call
        shape = _int_list(call.ty.shape.values) if call.ty.shape is not None else None
        if shape is None or list(res.shape) != shape:
            return call
        return relax.const(res.astype(dtype), dtype)

    def _eval(self, name, call):
        args = call.args
        if name in _BINARY:
            a, b = self._const(args[0]), self._const(args[1])
            if a is None or b is None:
                return None
            return _BINARY[name](a, b)
        if name == "relax.divide":
            a, b = self._const(args[0]), self._const(args[1])
            if a is None or b is None or not np.issubdtype(a.dtype, np.floating):
                return None
            return np.divide(a, b)
        if name in _UNARY:
            x = self._const(args[0])
            return None if x is None else _UNARY[name](x)
        if name == "relax.where":
            c, a, b = (self._const(x) for x in args)
            return None if c is None or a is None or b is None else np.where(c, a, b)
        if name in ("relax.reshape", "relax.astype", "relax.permute_dims", "relax.expand_dims", "relax.squeeze"):
            x = self._const(args[0])
            if x is None:
                return None
            at = call.attrs
            if name == "relax.reshape":
                shp = _int_list(args[1].values) if isinstance(args[1], relax.ShapeExpr) else None
                return None if shp is None else x.reshape(shp)
            if name == "relax.astype":
                dt = str(at.dtype)
                if np.issubdtype(x.dtype, np.floating) and not dt.startswith("float"):
                    return None  # float->int rounding/saturation rules: let TVM do it
                return x.astype(dt)
            if name == "relax.permute_dims":
                axes = None if at.axes is None else [int(a) for a in at.axes]
                return np.transpose(x, axes)
            if name == "relax.expand_dims":
                return np.expand_dims(x, tuple(int(a) for a in at.axis))
            if name == "relax.squeeze":
                return np.squeeze(x) if at.axis is None else np.squeeze(x, tuple(int(a) for a in at.axis))
        return None


def fold_constants_numpy(mod: tvm.IRModule) -> tvm.IRModule:
    """Return ``mod`` with constant-only reshape/astype/permute/expand/squeeze/add/sub/mul folded."""
    folder = _NumpyFold()
    new = tvm.IRModule({}, attrs=mod.attrs) if mod.attrs is not None else tvm.IRModule({})
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            func = folder.visit_expr(func)
        new[gv] = func
    new = relax.transform.CanonicalizeBindings()(new)
    return relax.transform.DeadCodeElimination()(new) if new.get_global_vars() else new
