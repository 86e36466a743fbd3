"""Fold constant-only Relax calls with numpy: one folder, used right after import and before lowering.

``from_onnx`` leaves many calls on constants (``reshape(bias)``, weight ``astype``/``subtract(zero_point)``,
``permute_dims(W)``...), and batch-norm folding and layout conversion add more.  TVM's ``FoldConstant``
evaluates each one by JIT-compiling a kernel: 3.4 s of the 9.8 s compile of the PP-OCR classifier, 20+ s
on ResNet-50 after batch-norm folding.  numpy does them in milliseconds.

Exactness: integer ops and IEEE correctly-rounded float ops (add, multiply, sqrt, divide...) give TVM's bits.
``exp``/``power``/``rsqrt`` of constants are folded too (numpy's are at least as accurate as TVM's), but
only on floats; integer division is left to TVM (floor vs truncation rules), and so are float->int casts
(rounding and saturation rules).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

#: largest constant (elements) folding may create
MAX_ELEMENTS = 1 << 24

_BINARY: dict[str, Callable[..., Any]] = {
    "relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply,
    "relax.maximum": np.maximum, "relax.minimum": np.minimum, "relax.equal": np.equal, "relax.less": np.less,
    "relax.greater": np.greater,
}
_FLOAT_BINARY: dict[str, Callable[..., Any]] = {"relax.divide": np.divide, "relax.power": np.power}
_UNARY: dict[str, Callable[..., Any]] = {
    "relax.isnan": np.isnan, "relax.isinf": np.isinf, "relax.negative": np.negative, "relax.abs": np.abs,
}
_FLOAT_UNARY: dict[str, Callable[..., Any]] = {
    "relax.sqrt": np.sqrt, "relax.exp": np.exp, "relax.rsqrt": lambda x: 1.0 / np.sqrt(x),
}


def int_list(values: Any) -> list[int] | None:
    """Static ints of a shape (``ShapeExpr`` values), or None when one is symbolic."""
    out = []
    for v in values:
        if isinstance(v, tvm.tirx.IntImm):
            out.append(int(v.value))
        elif isinstance(v, int):
            out.append(v)
        else:
            return None
    return out


def _floating(*arrays: np.ndarray) -> bool:
    return all(np.issubdtype(a.dtype, np.floating) for a in arrays)


@mutator
class NumpyFolder(PyExprMutator):
    """Replaces calls whose tensor arguments are all constants by the constant numpy computes."""

    def _const(self, expr: Any) -> np.ndarray | None:
        if isinstance(expr, relax.Var):
            bound = self.lookup_binding(expr)
            if bound is not None:
                expr = bound
        if isinstance(expr, tvm.ir.expr.GenericConst):
            value = expr.value
            return value.numpy() if hasattr(value, "numpy") else np.array(value, dtype=str(expr.ty.dtype))
        return None

    def visit_call_(self, call: Any) -> Any:
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op) or not isinstance(call.ty, relax.TensorType):
            return call
        try:
            result = self._eval(call.op.name, call)
        except Exception:  # noqa: BLE001 - an optimisation only: leave it to TVM
            result = None
        if result is None:
            return call
        result = np.asarray(result)
        if result.size > MAX_ELEMENTS or call.ty.shape is None:
            return call
        shape = int_list(call.ty.shape.values)
        if shape is None or list(result.shape) != shape:
            return call
        dtype = str(call.ty.dtype)
        # np.array, not np.ascontiguousarray: that one turns a 0-d result into shape (1,)
        return relax.const(np.array(result, dtype=dtype, order="C"), dtype)

    def _eval(self, name: str, call: Any) -> np.ndarray | None:
        args, attrs = call.args, call.attrs
        if name in _BINARY or name in _FLOAT_BINARY:
            a, b = self._const(args[0]), self._const(args[1])
            if a is None or b is None:
                return None
            if name in _FLOAT_BINARY:
                return _FLOAT_BINARY[name](a, b) if _floating(a, b) else None
            return _BINARY[name](a, b)
        if name in _UNARY or name in _FLOAT_UNARY:
            x = self._const(args[0])
            if x is None:
                return None
            if name in _FLOAT_UNARY:
                return _FLOAT_UNARY[name](x) if _floating(x) else None
            return _UNARY[name](x)
        if name == "relax.where":
            c, a, b = (self._const(x) for x in args)
            return None if c is None or a is None or b is None else np.where(c, a, b)
        x = self._const(args[0]) if args else None
        if x is None:
            return None
        if name == "relax.reshape":
            shape = int_list(args[1].values) if isinstance(args[1], relax.ShapeExpr) else None
            return None if shape is None else x.reshape(shape)
        if name == "relax.broadcast_to":
            shape = int_list(args[1].values) if isinstance(args[1], relax.ShapeExpr) else None
            return None if shape is None else np.broadcast_to(x, shape)
        if name == "relax.astype":
            dtype = str(attrs.dtype)
            if np.issubdtype(x.dtype, np.floating) and not dtype.startswith(("float", "bfloat")):
                return None  # float -> int rounding/saturation rules: let TVM do it
            return x.astype(dtype)
        if name == "relax.permute_dims":
            return np.transpose(x, None if attrs.axes is None else [int(a) for a in attrs.axes])
        if name == "relax.expand_dims":
            return np.expand_dims(x, tuple(int(a) for a in attrs.axis))
        if name == "relax.squeeze":
            return np.squeeze(x) if attrs.axis is None else np.squeeze(x, tuple(int(a) for a in attrs.axis))
        return None


def fold_constants_numpy(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its constant-only calls folded (a new module; the caller's is unchanged)."""
    folder = NumpyFolder()
    new = tvm.IRModule({}, attrs=mod.attrs) if mod.attrs is not None else tvm.IRModule({})
    for gv, func in mod.functions.items():
        new[gv] = folder.visit_expr(func) if isinstance(func, relax.Function) else func
    new = relax.transform.CanonicalizeBindings()(new)
    return relax.transform.DeadCodeElimination()(new) if new.get_global_vars() else new


@tvm.transform.module_pass(opt_level=0, name="forgekit.NumpyFoldConstant")
def NumpyFoldConstant(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:  # noqa: N802 - a pass, named like TVM's
    """:func:`fold_constants_numpy` as a module pass."""
    return fold_constants_numpy(mod)


def dangling_functions(mod: tvm.IRModule) -> list[str]:
    """Names of the functions that ``mod``'s Relax functions call but ``mod`` does not define."""
    defined = {gv.name_hint for gv in mod.get_global_vars()}
    return sorted({gv.name_hint for _gv, func in mod.functions_items() if isinstance(func, relax.Function)
                   for gv in relax.analysis.all_global_vars(func)} - defined)


def fold_constant(mod: tvm.IRModule) -> tvm.IRModule:
    """TVM's ``FoldConstant``, or ``mod`` unchanged where it would leave a call to a function it did not add.

    TVM 0.27's FoldConstant legalizes a ``dynamic_strided_slice`` (ONNX Slice with bounds that are tensor values:
    SLANet's decoder loop, ``x[:n]`` with ``n`` computed) into a call of its shape function and drops that
    function: the build failed with "There is no definition of I.GlobalVar("shape_func")", exit 6.  What it
    would have folded, this module's numpy folder and the pipeline's folding after LegalizeOps fold anyway."""
    folded = relax.transform.FoldConstant()(mod)
    return mod if dangling_functions(folded) else folded


# named as TVM's pass: compile_report.json lists pass names, and users read it
@tvm.transform.module_pass(opt_level=0, name="FoldConstant")
def FoldConstant(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:  # noqa: N802 - a pass, named like TVM's
    """:func:`fold_constant` as a module pass."""
    return fold_constant(mod)
