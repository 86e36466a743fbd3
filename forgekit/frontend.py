"""Load ONNX models and import them into Relax.

This module owns everything between "a path the user typed" and "a Relax IRModule": reading the file
with one-line errors, validating ``shape_dict``, and keeping the ONNX names of inputs and outputs (TVM
sanitises them).  The import itself goes through :mod:`forgekit.importer`: prepare (opset, node names,
input pinning, folding of shape sub-graphs) -> check (every unsupported operator at once, with node
names) -> TVM's ``from_onnx`` with forgekit's extra converters (LSTM/GRU/RNN, ConvInteger, QLinear*,
...) -> numpy folding of constant-only calls.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import onnx

from .errors import ForgekitError, ModelLoadError, UnsupportedOperatorError, UsageError  # noqa: F401

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
    #: input name -> dims (str: symbolic), or dim_param symbol -> int
    shape_dict: dict[str, Any] = field(default_factory=dict)
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
    """Operator types forgekit can import: the Relax ONNX frontend's plus :mod:`forgekit.importer`'s."""
    from .importer import supported_op_types

    return supported_op_types()


def find_unsupported(model: onnx.ModelProto, shape_dict: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """Everything that prevents import, in graph order, without converting anything.

    ``(op_type, node name)`` for every node forgekit cannot import (If/Loop bodies included; another
    domain's op is ``domain.OpType``; unnamed nodes get the name the importer gives them,
    ``<OpType>_<index>``), then ``("<dynamic input>", "name[dims]")`` for every input whose shape stays
    dynamic beyond a leading batch dimension once ``shape_dict`` is applied (see
    :func:`forgekit.importer.check_report` for the same as JSON).
    """
    from .importer import find_unsupported as _find

    pinned = normalize_shape_dict(model, shape_dict) if shape_dict else None
    return [tuple(f) for f in _find(model, pinned)]


def check_supported(model: onnx.ModelProto, path: str | None = None) -> None:
    """Raise :class:`UnsupportedOperatorError` listing every unsupported operator and its nodes."""
    from .importer import UnsupportedOperatorsError, unsupported_ops

    missing = unsupported_ops(model)
    if missing:
        raise UnsupportedOperatorsError(missing, f"'{path}'" if path else None)


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


def _dim_symbols(model: onnx.ModelProto) -> set[str]:
    """``dim_param`` names used by the real graph inputs."""
    inits = {i.name for i in model.graph.initializer}
    return {d.dim_param for vi in model.graph.input if vi.name not in inits
            for d in vi.type.tensor_type.shape.dim if d.dim_param}


def normalize_shape_dict(model: onnx.ModelProto, shape_dict: dict[str, Any] | None) -> dict[str, Any]:
    """Validate ``shape_dict`` and turn dims into ints (strings stay symbolic).

    Keys are input names (value: the full shape) or ``dim_param`` symbols of the inputs (value: an int,
    e.g. ``{"batch": 1, "sequence": 128}``).  A shape may replace a static dimension (that is how
    :meth:`IRModule.set_batch_size` re-imports a fixed-batch model) but must have the input's rank.
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
            raise UsageError(f"shape_dict names input '{name}', but the model's inputs are: {', '.join(names)}"
                             f"{extra}.")
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
            raise UsageError(f"shape_dict['{name}'] must be a list of dimensions such as [1, 3, 224, 224], "
                             f"got {shape!r}.")
        dims: list = []
        for d in shape:
            if isinstance(d, str) and not d.isdigit():
                dims.append(d)
            else:
                value = int(d)
                if value <= 0:
                    raise UsageError(f"Input '{name}' dimension {value} must be positive.")
                dims.append(value)
        have = infos[name].shape
        if have and len(have) != len(dims):
            raise UsageError(f"shape_dict['{name}'] has {len(dims)} dimension(s) but input '{name}' has "
                             f"{len(have)} ({'x'.join(str(d) for d in have)}): give all {len(have)}.")
        out[name] = dims
    return out


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


def to_relax(source: OnnxSource) -> tuple[Any, list[TensorInfo], list[TensorInfo]]:
    """Import ``source`` into a Relax IRModule with weights bound as constants.

    prepare (:func:`forgekit.importer.prepare_onnx`; dims not pinned by ``shape_dict`` stay symbolic)
    -> check (every unsupported operator at once) -> TVM's ``from_onnx`` with the importer's converters
    -> numpy folding of constant-only calls.  Returns the module and the ONNX-named input and output
    descriptions (input shapes as imported).
    """
    import tvm
    from tvm import relax

    from .importer import (
        ConversionError,
        ImportErrorBase,
        PrepareError,
        UnsupportedOperatorsError,
        convert,
        prepare_onnx,
        unsupported_ops,
    )
    from .importer.errors import REPORT_HINT, fmt_shape, one_line

    model = source.model
    where = f"'{source.path}'" if source.path else None
    try:
        prepared = prepare_onnx(model, source.shape_dict, default_batch=None, allow_dynamic=True,
                                allow_static_override=True)
    except ForgekitError:
        raise
    except Exception as exc:  # shape inference or the version converter choked on the graph
        missing = unsupported_ops(model)
        if missing:  # the likelier cause, and the more useful message
            raise UnsupportedOperatorsError(missing, where) from None
        raise PrepareError(f"Preparing {where or 'the model'} for import failed ({one_line(exc)}): "
                           "check it with onnx.checker or re-export it.") from exc
    missing = unsupported_ops(prepared)
    if missing:
        raise UnsupportedOperatorsError(missing, where)
    from .importer.qdq import fuse_qdq

    prepared = fuse_qdq(prepared)  # QDQ conv/matmul -> ConvInteger/MatMulInteger (the integer path)

    inputs = graph_inputs(prepared)
    symbols: dict[str, Any] = {}
    # from_onnx wants tirx Vars for symbolic dims, never strings; one Var per symbol name.
    shape_dict = {info.name: [d if isinstance(d, int) else symbols.setdefault(str(d), tvm.tirx.Var(str(d), "int64"))
                              for d in info.shape] for info in inputs}
    dtype_dict = {info.name: info.dtype for info in inputs}
    try:
        mod = convert(prepared, shape_dict=shape_dict, dtype_dict=dtype_dict, where=where)
        mod = relax.transform.Normalize()(mod)
    except ConversionError as exc:
        dynamic = [i for i in inputs if not all(isinstance(d, int) for d in i.shape)]
        if dynamic:
            listing = ", ".join(f"{i.name}{fmt_shape(i.shape)}" for i in dynamic)
            first = dynamic[0]
            example = "x".join(str(d) if isinstance(d, int) else "1" for d in first.shape)
            hint = (f"inputs {listing} are still dynamic: pin them with shape_dict (CLI: --input-shape "
                    f"{first.name}={example}), else {REPORT_HINT}")
            raise exc.with_context(where, hint) from None
        raise
    except ImportErrorBase:
        raise
    except Exception as exc:  # Normalize on what the frontend built
        raise ModelLoadError(f"TVM could not import {where or 'the model'}: {_first_line(exc)}; "
                             f"{REPORT_HINT}.") from exc
    return mod, inputs, graph_outputs(model)
