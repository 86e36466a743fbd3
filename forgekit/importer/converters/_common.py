"""Small helpers shared by the converters."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter  # noqa: F401 (re-export)


def attr_str(attr: dict, name: str, default: str) -> str:
    v = attr.get(name, default)
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def attr_strs(attr: dict, name: str) -> list[str]:
    v = attr.get(name)
    if v is None:
        return []
    if isinstance(v, (bytes, str)):
        v = (v,)
    return [s.decode("utf-8") if isinstance(s, bytes) else str(s) for s in v]


def const_value(expr) -> np.ndarray | None:
    """numpy value of a relax constant, else None."""
    if expr is None:
        return None
    if isinstance(expr, tvm.ir.expr.GenericConst):
        return expr.value.numpy()
    return None


def dtype_of(expr) -> str:
    return str(expr.ty.dtype)


def static_dim(expr, axis: int, what: str) -> int:
    """Static size of ``expr``'s dimension ``axis``; raises with a clear message if symbolic."""
    dim = expr.ty.shape.values[axis]
    if isinstance(dim, (tvm.tirx.IntImm, int)):
        return int(dim)
    raise ValueError(f"{what} must be static but is '{dim}'; pin the input shapes (shape_dict)")


def ndim_of(expr) -> int:
    return int(expr.ty.ndim)


def const(value, dtype: str):
    return relax.const(np.asarray(value, dtype=dtype), dtype)
