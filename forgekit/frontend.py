"""Load ONNX models and import them into Relax.

This module owns everything between "a path the user typed" and "a Relax IRModule": reading the file
with one-line errors, listing every unsupported operator at once (with node names), validating
``shape_dict``, and keeping the ONNX names of inputs and outputs (TVM sanitises them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import onnx

from .errors import ModelLoadError, UnsupportedOperatorError, UsageError

#: ONNX element type -> numpy dtype name
_ONNX_DTYPES = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.INT16: "int16",
    onnx.TensorProto.UINT16: "uint16",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.BOOL: "bool",
}

# Operators of the default domain that the Relax frontend declares but refuses at conversion time
# whatever the attributes; listing them here turns a mid-import traceback into the upfront list.
_KNOWN_REFUSED: set[str] = set()


@dataclass(frozen=True)
class TensorInfo:
    """Name, shape and dtype of a graph input or output (symbolic dims are strings)."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


@dataclass
class OnnxSource:
    """The ONNX model an IRModule was imported from, kept so it can be re-imported (batch size)."""

    model: onnx.ModelProto
    shape_dict: dict[str, list[int | str]] = field(default_factory=dict)
    path: str | None = None


def load_onnx(model_or_path: Any) -> tuple[onnx.ModelProto, str | None]:
    """Read an ONNX model from a path, bytes or ``ModelProto``; returns it and its path (if any)."""
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path, None
    if isinstance(model_or_path, (bytes, bytearray)):
        try:
            return onnx.load_from_string(bytes(model_or_path)), None
        except Exception as exc:
            raise ModelLoadError(f"The bytes given are not a valid ONNX model: {_first_line(exc)}") from None
    if not isinstance(model_or_path, (str, os.PathLike)):
        raise UsageError(f"Expected an ONNX path or onnx.ModelProto, got {type(model_or_path).__name__}.")
    path = Path(model_or_path)
    if not path.exists():
        raise ModelLoadError(f"Model file '{path}' does not exist: check the path.")
    if path.is_dir():
        raise ModelLoadError(f"'{path}' is a directory: give the path of an .onnx file.")
    try:
        model = onnx.load(str(path))
    except Exception as exc:
        raise ModelLoadError(f"'{path}' is not a valid ONNX model ({_first_line(exc)}): re-export it.") from None
    if not model.graph.node:
        raise ModelLoadError(f"'{path}' holds no graph nodes: is it really an ONNX model?")
    return model, str(path)


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def _iter_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node, including those of If/Loop/Scan bodies."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _iter_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _iter_nodes(sub)


def supported_ops() -> set[str]:
    """Operator types the Relax ONNX frontend (plus forgekit's converters) can import."""
    from tvm.relax.frontend.onnx import onnx_frontend

    return set(onnx_frontend._get_convert_map()) - _KNOWN_REFUSED


def find_unsupported(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(op_type, node name) for every node forgekit cannot import, in graph order."""
    known = supported_ops()
    out = []
    for i, node in enumerate(_iter_nodes(model.graph)):
        domain = node.domain or "ai.onnx"
        if node.op_type not in known or domain not in ("ai.onnx", "ai.onnx.ml", ""):
            label = node.op_type if domain == "ai.onnx" else f"{domain}.{node.op_type}"
            out.append((label, node.name or f"#{i}"))
    return out


def check_supported(model: onnx.ModelProto, path: str | None = None) -> None:
    """Raise :class:`UnsupportedOperatorError` listing every unsupported operator and its nodes."""
    missing = find_unsupported(model)
    if not missing:
        return
    by_op: dict[str, list[str]] = {}
    for op, node in missing:
        by_op.setdefault(op, []).append(node)
    parts = [f"{op} ({', '.join(nodes[:5])}{', ...' if len(nodes) > 5 else ''})" for op, nodes in by_op.items()]
    where = f"'{path}'" if path else "The model"
    raise UnsupportedOperatorError(
        f"{where} uses {len(by_op)} unsupported operator type(s): {'; '.join(parts)}. "
        "Replace them in the exporter or open an issue with the model."
    )


def _value_info(vi: onnx.ValueInfoProto) -> TensorInfo:
    tt = vi.type.tensor_type
    dims: list[int | str] = []
    for i, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        else:
            dims.append(d.dim_param or f"{vi.name}_dim{i}")
    return TensorInfo(vi.name, tuple(dims), _ONNX_DTYPES.get(tt.elem_type, onnx.TensorProto.DataType.Name(tt.elem_type).lower()))


def graph_inputs(model: onnx.ModelProto) -> list[TensorInfo]:
    """Real inputs of the graph (old-style models also list their initializers as inputs)."""
    inits = {i.name for i in model.graph.initializer}
    return [_value_info(vi) for vi in model.graph.input if vi.name not in inits]


def graph_outputs(model: onnx.ModelProto) -> list[TensorInfo]:
    """Outputs of the graph as declared in the file."""
    return [_value_info(vi) for vi in model.graph.output]


def normalize_shape_dict(model: onnx.ModelProto, shape_dict: dict[str, Sequence[Any]] | None) -> dict[str, list]:
    """Validate ``shape_dict`` names and turn dims into ints (strings stay symbolic)."""
    if not shape_dict:
        return {}
    names = [i.name for i in graph_inputs(model)]
    out: dict[str, list] = {}
    for name, shape in shape_dict.items():
        if name not in names:
            raise UsageError(f"shape_dict names input '{name}', but the model's inputs are: {', '.join(names)}.")
        dims: list = []
        for d in shape:
            if isinstance(d, str) and not d.isdigit():
                dims.append(d)
            else:
                value = int(d)
                if value <= 0:
                    raise UsageError(f"Input '{name}' dimension {value} must be positive.")
                dims.append(value)
        out[name] = dims
    return out


def to_relax(source: OnnxSource) -> tuple[Any, list[TensorInfo], list[TensorInfo]]:
    """Import ``source`` into a Relax IRModule with weights bound as constants.

    Returns the module and the ONNX-named input and output descriptions.
    """
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    model = source.model
    check_supported(model, source.path)
    inputs = graph_inputs(model)
    shape_dict: dict[str, list] = {}
    for info in inputs:
        dims = source.shape_dict.get(info.name, list(info.shape))
        # from_onnx wants tirx Vars for symbolic dims, never strings.
        shape_dict[info.name] = [d if isinstance(d, int) else tvm.tirx.Var(str(d), "int64") for d in dims]
    dtype_dict = {info.name: info.dtype for info in inputs}
    try:
        mod = from_onnx(model, shape_dict=shape_dict, dtype_dict=dtype_dict)
        mod = relax.transform.Normalize()(mod)
    except Exception as exc:  # the frontend raises assorted TVM and Python errors
        where = f"'{source.path}'" if source.path else "the model"
        raise ModelLoadError(f"TVM could not import {where}: {_first_line(exc)}") from exc
    shaped = [TensorInfo(i.name, tuple(source.shape_dict.get(i.name, i.shape)), i.dtype) for i in inputs]
    return mod, shaped, graph_outputs(model)
