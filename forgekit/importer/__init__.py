"""ONNX import for TVM 0.27 Relax: load, prepare (pin + fold), check, convert with extra converters.

:func:`forgekit.from_onnx` goes through this package's one import path, :func:`import_onnx`; it can also be
used on its own::

    from forgekit.importer import import_onnx, find_unsupported, check_report, prepare_onnx

    imported = import_onnx("model.onnx", {"x": [1, 3, 320, 320]})   # .mod: a Relax tvm.IRModule
    check_report("model.onnx")   # {"unsupported": [{"op", "node"}...], "dynamic_inputs": [{"name", "shape"}...]}

* :mod:`.load` — reading files with one-line errors, graph inputs/outputs, ``shape_dict`` validation.
* :mod:`.prepare` — ``prepare_onnx``: opset >= 11, node names, input pinning and freezing, shape inference
  and constant folding of shape sub-graphs (``onnx`` + ``numpy`` only).
* :mod:`.check` — ``find_unsupported`` / ``check_report`` (milliseconds) and ``convert``.
* :mod:`.qdq` — QDQ conv/matmul patterns fused onto ConvInteger/MatMulInteger.
* :mod:`.converters` — LSTM/GRU/RNN, ConvInteger, QLinearConv/MatMul, com.microsoft QGemm/QLinear*,
  DynamicQuantizeLSTM, patched into TVM's frontend for the duration of an import.
* :mod:`.pipeline` — ``import_onnx``: all of the above, then :mod:`forgekit.passes.canonicalize` and
  numpy folding (:mod:`forgekit.passes.numpy_fold`).
* :mod:`.errors` — every error is a :class:`forgekit.errors.ModelLoadError` (exit 3) or
  :class:`forgekit.errors.UnsupportedOperatorError` (exit 4) with a one-line message.

Importing this package does not import TVM (the converter registry is loaded on first use) nor
onnxruntime (never needed).
"""

from __future__ import annotations

import importlib
from typing import Any

from .check import (
    DYNAMIC_INPUT,
    Finding,
    check_report,
    convert,
    find_unsupported,
    supported_op_types,
    unsupported_ops,
)
from .errors import (
    ConversionError,
    DynamicDimensionError,
    DynamicShapeError,
    ImportErrorBase,
    PrepareError,
    UnsupportedOperatorsError,
)
from .load import OnnxSource, graph_inputs, graph_outputs, load_onnx, normalize_shape_dict
from .onnx_fold import fold_constants
from .onnx_utils import dynamic_inputs
from .prepare import prepare_onnx

# These need TVM: loaded on first access.
_LAZY = {
    "EXTRA_CONVERTERS": ".converters",
    "patched_frontend": ".converters",
    "register_converter": ".converters",
    "ImportedModel": ".pipeline",
    "import_onnx": ".pipeline",
    "import_source": ".pipeline",
}

__all__ = [
    "DYNAMIC_INPUT",
    "EXTRA_CONVERTERS",
    "ConversionError",
    "DynamicDimensionError",
    "DynamicShapeError",
    "Finding",
    "ImportErrorBase",
    "PrepareError",
    "UnsupportedOperatorsError",
    "check_report",
    "convert",
    "dynamic_inputs",
    "find_unsupported",
    "fold_constants",
    "graph_inputs",
    "graph_outputs",
    "ImportedModel",
    "import_onnx",
    "import_source",
    "load_onnx",
    "normalize_shape_dict",
    "OnnxSource",
    "patched_frontend",
    "prepare_onnx",
    "register_converter",
    "supported_op_types",
    "unsupported_ops",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'forgekit.importer' has no attribute '{name}'")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
