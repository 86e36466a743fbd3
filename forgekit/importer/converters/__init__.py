"""Extra ONNX -> Relax converters and the hook that installs them into TVM's frontend.

TVM 0.27's Relax ONNX frontend looks converters up through the module-level
function ``tvm.relax.frontend.onnx.onnx_frontend._get_convert_map()`` (both in
``_check_for_unsupported_ops`` and ``_convert_operator``).  :func:`patched_frontend`
temporarily replaces that function by one returning TVM's map plus ours, with
every converter wrapped so that a failure names the ONNX node it came from.
Converters follow TVM's convention: an ``OnnxOpConverter`` subclass with
``_impl_v<N>(cls, bb, inputs, attr, params)`` classmethods.

One module per op family: :mod:`.rnn` (LSTM, GRU, RNN), :mod:`.quant`
(ConvInteger, QLinearConv, QLinearMatMul and com.microsoft QLinear* ops), :mod:`.quant_lstm`
(com.microsoft DynamicQuantizeLSTM), and fixes of TVM's own:
:mod:`.slicing` (exact shapes on symbolic dimensions), :mod:`.resize` (ONNX's coordinates, ``axes``),
:mod:`.pool` (SAME padding), :mod:`.einsum` (matrix products as matmul), :mod:`.pad` (constant Pad as a
Relax op), :mod:`.power` (an exponent of another type), :mod:`.shapes` (integer casts of symbolic shapes,
Reshape and Tile to shapes read off values), :mod:`.expand` (broadcasting on symbolic dimensions),
:mod:`.squeeze` (Squeeze without axes on symbolic dimensions: the rank the model declares); :mod:`.loop`
(ONNX Loop as a recursive Relax function).  Any converter's tensor of known rank but unknown extents gets
symbols (:func:`with_symbolic_shape`).
"""

from __future__ import annotations

import contextlib
import threading

import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _fe

from ..errors import ConversionError, ImportErrorBase, one_line
from . import (einsum, expand, loop, onehot, pad, pool, power, quant, quant_lstm, resize, rnn, shapes, slicing,
               squeeze)

#: op_type -> converter class; add your own with :func:`register_converter`.
EXTRA_CONVERTERS: dict[str, type] = {**rnn.CONVERTERS, **quant.CONVERTERS, **quant_lstm.CONVERTERS,
                                     **slicing.CONVERTERS,
                                     **resize.CONVERTERS, **pool.CONVERTERS, **onehot.CONVERTERS,
                                     **shapes.CONVERTERS, **loop.CONVERTERS,
                                     **expand.CONVERTERS, **squeeze.CONVERTERS, **power.CONVERTERS,
                                     **pad.CONVERTERS, **einsum.CONVERTERS}

#: ops handled outside the convert map: If by the frontend itself, Scan rewritten as a Loop before
#: conversion (importer/loops.py).
DIRECTLY_HANDLED = {"If", "Scan"}

_ORIG_GET_CONVERT_MAP = _fe._get_convert_map
_LOCK = threading.RLock()


def register_converter(op_type: str, converter: type) -> None:
    """Register (or override) a converter for ``op_type``."""
    EXTRA_CONVERTERS[op_type] = converter


def tvm_convert_map() -> dict[str, type]:
    return dict(_ORIG_GET_CONVERT_MAP())


def full_convert_map(extra: dict[str, type] | None = None) -> dict[str, type]:
    """TVM's convert map overlaid with ours (ours win) and ``extra``."""
    m = tvm_convert_map()
    m.update(EXTRA_CONVERTERS)
    if extra:
        m.update(extra)
    return m


def with_symbolic_shape(bb, expr):
    """``expr``, or where it is a tensor of known rank whose extents TVM could not express (a Slice bounded by
    tensor values: ``x[:n]``), the same tensor with one fresh symbol per extent, bound at run time
    (``match_cast``).  Without them the ops after it could not be lowered ("emit_te now only supports Tensor
    that has ShapeExpr shape") and a ``Shape`` of it was no shape at all (SLANet's decoder loop)."""
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.shape is not None or ty.ndim < 0:
        return expr
    symbols = [tvm.tirx.Var(f"d{i}", "int64") for i in range(ty.ndim)]
    return bb.match_cast(expr, relax.TensorType(symbols, ty.dtype))


def _wrap(op_type: str, conv_cls: type) -> type:
    class _Wrapped(_fe.OnnxOpConverter):
        @classmethod
        def get_converter(cls, opset):
            fn = conv_cls.get_converter(opset)

            def run(bb, inputs, attr, params):
                name = (attr.get("tvm_custom") or {}).get("name") if isinstance(attr, dict) else None
                try:
                    sym = fn(bb, inputs, attr, params)
                    if isinstance(sym, relax.Expr):
                        sym = with_symbolic_shape(bb, bb.normalize(sym))
                    return sym
                except ImportErrorBase:
                    raise
                except Exception as exc:  # noqa: BLE001 - turned into one line
                    raise ConversionError(op_type, name, one_line(exc)) from None

            return run

    _Wrapped.__name__ = f"Wrapped{conv_cls.__name__}"
    return _Wrapped


@contextlib.contextmanager
def patched_frontend(extra: dict[str, type] | None = None):
    """Within the block, TVM's ONNX frontend sees our converters (error-wrapped)."""
    wrapped = {k: _wrap(k, v) for k, v in full_convert_map(extra).items()}
    with _LOCK:
        # re-entrant: a Loop body is imported while its graph's conversion is under way
        previous = _fe._get_convert_map
        _fe._get_convert_map = lambda: wrapped
        try:
            yield wrapped
        finally:
            _fe._get_convert_map = previous


__all__ = [
    "EXTRA_CONVERTERS",
    "DIRECTLY_HANDLED",
    "full_convert_map",
    "patched_frontend",
    "register_converter",
    "tvm_convert_map",
]
