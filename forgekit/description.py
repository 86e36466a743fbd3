"""Plain data about a model that the stages pass along: tensor specs and what the artifact records.

Stages never reach into :class:`forgekit.IRModule`; the façade hands them a ``tvm.IRModule`` plus a
:class:`ModelDescription`, which is all the artifact writer and the metadata need.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TensorInfo:
    """Name, shape and dtype of a graph input or output (symbolic dims are strings)."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


@dataclass(frozen=True)
class ModelDescription:
    """What an artifact says about the model it was compiled from."""

    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    #: file name of the ONNX model, None when it came from memory
    source: str | None = None
    #: structural hash (architecture only), 16 hex digits
    hash: str = ""
    #: sha256 of the architecture and every weight byte
    fingerprint: str = ""
    #: "float32", "int8", "uint8" ... (before build options such as float16)
    precision: str = "float32"
    #: the quantization parameters (None unless quantized)
    quantization: dict[str, Any] | None = None
    #: per-layer fp32-vs-quantized agreement (None unless measured)
    quantization_report: dict[str, Any] | None = None
    #: operator histogram of the graph, most frequent first
    operators: dict[str, int] = field(default_factory=dict)
    #: bytes of the weights (constants) the library will embed
    weight_bytes: int = 0
    #: dynamic dimension -> {"min": int, "max": int | None}: the sizes the artifact serves
    dynamic: dict[str, Any] = field(default_factory=dict)
    #: input name -> the value ``freeze`` made it (the ONNX model still has the input)
    frozen: dict[str, Any] = field(default_factory=dict)
    #: input name -> the values it is meant to take: ``{"min", "max"}`` of the indices of a table it indexes,
    #: or of a quantized model's calibration samples (with their ``mean`` and ``std``)
    input_values: dict[str, dict[str, float]] = field(default_factory=dict)
