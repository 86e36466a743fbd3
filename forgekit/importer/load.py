"""Reading ONNX models and validating what the user says about their inputs.

Everything between "a path the user typed" and a ``ModelProto`` the importer can work on: reading the
file with one-line errors, the graph's real inputs and outputs (with their ONNX names; TVM sanitises
them), and ``shape_dict`` validated against the model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import onnx

from ..description import TensorInfo
from ..errors import ModelLoadError, UsageError
from ..log import first_line

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


@dataclass
class OnnxSource:
    """The ONNX model an IRModule was imported from, kept so it can be re-imported (batch size)."""

    model: onnx.ModelProto
    #: input name -> dims (str: symbolic), or dim_param symbol -> int
    shape_dict: dict[str, Any] = field(default_factory=dict)
    path: str | None = None
    #: input name -> value: inputs turned into constants before import
    freeze: dict[str, Any] = field(default_factory=dict)
    #: dynamic dimension -> its bounds (:class:`forgekit.importer.dynamic.DimRange`)
    dynamic: dict[str, Any] = field(default_factory=dict)


def load_onnx(model_or_path: Any) -> tuple[onnx.ModelProto, str | None]:
    """Read an ONNX model from a path, bytes or ``ModelProto``; returns it and its path (if any)."""
    if isinstance(model_or_path, onnx.ModelProto):
        _no_unloaded_external_data(model_or_path, "The ModelProto given")
        return model_or_path, None
    if isinstance(model_or_path, (bytes, bytearray)):
        try:
            model = onnx.load_from_string(bytes(model_or_path))
        except Exception as exc:
            raise ModelLoadError(f"The bytes given are not a valid ONNX model: {first_line(exc)}") from None
        _no_unloaded_external_data(model, "The bytes given")
        return model, None
    if not isinstance(model_or_path, (str, os.PathLike)):
        raise UsageError(f"Expected an ONNX path or onnx.ModelProto, got {type(model_or_path).__name__}.")
    path = Path(model_or_path)
    if not path.exists():
        raise ModelLoadError(f"Model file '{path}' does not exist: check the path.")
    if path.is_dir():
        raise ModelLoadError(f"'{path}' is a directory: give the path of an .onnx file.")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise ModelLoadError(f"'{path}' is not a valid ONNX model ({first_line(exc)}): re-export it.") from None
    _load_external_data(model, path)
    if not model.graph.node:
        raise ModelLoadError(f"'{path}' holds no graph nodes: is it really an ONNX model?")
    return model, str(path)


def _external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """Tensors whose bytes are in another file (initializers and attribute tensors, subgraphs included)."""
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    return [t for t in _get_all_tensors(model) if uses_external_data(t)]


def _load_external_data(model: onnx.ModelProto, path: Path) -> None:
    """Read the weights a model keeps in external files (``.onnx.data``), which ONNX looks for relative to the
    model's folder.  onnx's own error for a missing one ("... should be stored in X, but it is not regular
    file") sent users to re-export a model that only lacked the file next to it: say which file, for which
    tensors, and where it was looked for."""
    from onnx.external_data_helper import ExternalDataInfo, load_external_data_for_model

    tensors = _external_tensors(model)
    if not tensors:
        return
    folder = path.resolve().parent
    by_file: dict[str, list[str]] = {}
    for tensor in tensors:
        info = ExternalDataInfo(tensor)
        by_file.setdefault(info.location, []).append(tensor.name)
        file = folder / info.location
        if file.is_file() and info.length and file.stat().st_size < (info.offset or 0) + info.length:
            raise ModelLoadError(f"'{path}' keeps tensor '{tensor.name}' at bytes {info.offset or 0}.."
                                 f"{(info.offset or 0) + info.length} of '{file}', which is only "
                                 f"{file.stat().st_size} bytes: the data file is truncated or from another "
                                 "export; copy it again with the model.")
    missing = {location: names for location, names in by_file.items() if not (folder / location).is_file()}
    if missing:
        files = "; ".join(f"'{location}' ({_names(names)}), looked for at {folder / location}"
                          for location, names in missing.items())
        raise ModelLoadError(f"'{path}' keeps its weights in external data file(s) that are missing: {files}. "
                             "Copy the data file(s) into the model's folder under that name (the .onnx and its "
                             "data travel together).")
    try:
        load_external_data_for_model(model, str(folder))
    except Exception as exc:  # a location outside the model's folder, an unreadable file
        raise ModelLoadError(f"'{path}': reading its external data failed ({first_line(exc)}).") from None


def _no_unloaded_external_data(model: onnx.ModelProto, what: str) -> None:
    """A model not read from its path cannot find its external data files (they are relative to the path)."""
    tensors = _external_tensors(model)
    if tensors:
        location = tensors[0].external_data[0].value if tensors[0].external_data else "?"
        raise ModelLoadError(f"{what} keeps {_names([t.name for t in tensors])} in the external data file "
                             f"'{location}', which only its path can locate: pass the .onnx path instead (with "
                             "the data file next to it), or onnx.load(path) first.")


def _names(names: list[str]) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:3])
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return f"tensor{'s' if len(names) > 1 else ''} {shown}{more}"


def _value_info(vi: onnx.ValueInfoProto) -> TensorInfo:
    tt = vi.type.tensor_type
    dims: list[int | str] = []
    for i, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value") and d.dim_value >= 0:  # some exporters write -1 for "dynamic"
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


def _dim_symbols(model: onnx.ModelProto) -> set[str]:
    """``dim_param`` names used by the real graph inputs."""
    inits = {i.name for i in model.graph.initializer}
    return {d.dim_param for vi in model.graph.input if vi.name not in inits
            for d in vi.type.tensor_type.shape.dim if d.dim_param}


def normalize_shape_dict(model: onnx.ModelProto, shape_dict: dict[str, Any] | None, *,
                         override_batch: bool = False) -> dict[str, Any]:
    """Validate ``shape_dict`` and turn dims into ints (identifier strings stay symbolic).

    Keys are input names (value: the full shape) or ``dim_param`` symbols of the inputs (value: an int,
    e.g. ``{"batch": 1, "sequence": 128}``).  A shape must have the input's rank and agree with its static
    dimensions; only :meth:`IRModule.set_batch_size` may replace a static leading (batch) dimension
    (``override_batch``).  Every refusal is one UsageError naming the input and the dimension.
    """
    if not shape_dict:
        return {}
    infos = {i.name: i for i in graph_inputs(model)}
    names = list(infos)
    symbols = _dim_symbols(model)
    out: dict[str, Any] = {}
    for name, shape in shape_dict.items():
        if name not in infos:
            if name in symbols:
                out[name] = _symbol_value(name, shape)
                continue
            extra = f" (or one of the dimension symbols: {', '.join(sorted(symbols))})" if symbols else ""
            raise UsageError(f"The input shapes (--input-shape / shape_dict) name input '{name}', but the model's "
                             f"inputs are: {', '.join(names)}{extra}.")
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
            raise UsageError(f"shape_dict['{name}'] must be a list of dimensions such as [1, 3, 224, 224], "
                             f"got {shape!r}.")
        have = infos[name].shape
        if have and len(have) != len(shape):
            raise UsageError(f"The shape given for input '{name}' has {len(shape)} dimension(s) but the input has "
                             f"{len(have)} ({'x'.join(str(d) for d in have)}): give all {len(have)}.")
        out[name] = [_dim(name, axis, d, have[axis] if have else None, override_batch and axis == 0)
                     for axis, d in enumerate(shape)]
    return out


def _dim(name: str, axis: int, value: Any, static: int | str | None, may_override: bool) -> int | str:
    """One dimension of a given shape: a positive int or a symbol name, consistent with the model."""
    if isinstance(value, str) and not value.strip().lstrip("-").isdigit():
        if not value.isidentifier():
            raise UsageError(f"Input '{name}' dimension {axis} is '{value}': give a positive integer or a symbol "
                             "name (letters, digits, _).")
        if isinstance(static, int) and not may_override:
            raise UsageError(f"Input '{name}' dimension {axis} is {static} in the model, not dynamic: it cannot be "
                             f"made '{value}'.")
        return value
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise UsageError(f"Input '{name}' dimension {axis} is {value!r}: give a positive integer.") from None
    if number <= 0:
        raise UsageError(f"Input '{name}' dimension {axis} is {number}: every dimension must be at least 1 "
                         "(use a symbol name to keep it dynamic).")
    if isinstance(static, int) and static != number and not may_override:
        raise UsageError(f"Input '{name}' dimension {axis} is {static} in the model; the shape given says {number}: "
                         "only dynamic dimensions can be set.")
    return number


def _symbol_value(name: str, value: Any) -> int:
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and len(value) == 1:
        value = value[0]
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise UsageError(f"shape_dict['{name}'] sets the dimension symbol '{name}': give an int, "
                         f"got {value!r}.") from None
    if number <= 0:
        raise UsageError(f"Dimension '{name}' = {number} must be positive.")
    return number
