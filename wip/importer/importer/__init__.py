"""ONNX import for TVM 0.27 Relax: prepare (pin + fold), check, extra converters.

    from importer import import_onnx, find_unsupported, prepare_onnx
    mod = import_onnx("model.onnx", {"x": [1, 3, 320, 320]})
"""

from .check import DYNAMIC_INPUT, Finding, find_unsupported, import_onnx, unsupported_ops
from .converters import EXTRA_CONVERTERS, patched_frontend, register_converter
from .errors import (
    ConversionError,
    DynamicShapeError,
    ImportErrorBase,
    PrepareError,
    UnsupportedOperatorsError,
)
from .prepare import dynamic_inputs, fold_constants, prepare_onnx

__all__ = [
    "DYNAMIC_INPUT",
    "EXTRA_CONVERTERS",
    "ConversionError",
    "DynamicShapeError",
    "Finding",
    "ImportErrorBase",
    "PrepareError",
    "UnsupportedOperatorsError",
    "dynamic_inputs",
    "find_unsupported",
    "fold_constants",
    "import_onnx",
    "patched_frontend",
    "prepare_onnx",
    "register_converter",
    "unsupported_ops",
]
