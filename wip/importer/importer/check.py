"""Pre-flight check and the one-call import: ONNX ModelProto -> tvm.IRModule."""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import onnx

from .errors import (
    ConversionError,
    DynamicShapeError,
    ImportErrorBase,
    PrepareError,
    UnsupportedOperatorsError,
    one_line,
)
from .prepare import _pin_inputs, iter_nodes, prepare_onnx

#: op_type used in :func:`find_unsupported` results for a dynamic input.
DYNAMIC_INPUT = "<dynamic input>"
#: domains whose ops are looked up by op_type in the convert map (TVM ignores domains).
KNOWN_DOMAINS = ("", "ai.onnx", "com.microsoft", "ai.onnx.ml")


class Finding(NamedTuple):
    op_type: str
    node_name: str


def _load(model) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (str, os.PathLike)):
        return onnx.load(os.fspath(model))
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model))
    raise PrepareError(f"expected onnx.ModelProto or a path, got {type(model).__name__}")


def unsupported_ops(model: onnx.ModelProto, extra: dict | None = None) -> list[Finding]:
    """Every node (subgraphs included) whose op has no converter."""
    from .converters import DIRECTLY_HANDLED, full_convert_map

    cmap = full_convert_map(extra)
    out = []
    for node in iter_nodes(model.graph):
        op = node.op_type
        name = node.name or f"<unnamed {op}>"
        if node.domain not in KNOWN_DOMAINS:
            out.append(Finding(f"{node.domain}::{op}", name))
        elif op not in cmap and op not in DIRECTLY_HANDLED:
            out.append(Finding(op if node.domain in ("", "ai.onnx") else f"{node.domain}::{op}", name))
    return out


def unresolved_dynamic_inputs(
    model: onnx.ModelProto,
    shape_dict: Mapping | None = None,
    default_batch: int | None = 1,
) -> list[tuple[str, list | None]]:
    """Inputs that would stay dynamic after pinning with ``shape_dict``/``default_batch``."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.node[:]
    try:
        _pin_inputs(m, shape_dict, default_batch, allow_dynamic=False)
    except DynamicShapeError as exc:
        return exc.inputs
    return []


def find_unsupported(
    model,
    shape_dict: Mapping | None = None,
    *,
    default_batch: int | None = 1,
    extra_converters: dict | None = None,
) -> list[Finding]:
    """List what prevents import, without compiling anything.

    Returns ``(op_type, node_name)`` for every node whose operator neither TVM's
    frontend nor this package can convert (nodes in If/Loop bodies included;
    ops from an unknown domain show as ``"domain::Op"``), followed by one
    ``("<dynamic input>", "name[dims]")`` entry per input that would still be
    dynamic given ``shape_dict`` and the batch=1 default (see ``prepare_onnx``).
    An empty list means the model should import.
    """
    model = _load(model)
    found = unsupported_ops(model, extra_converters)
    for name, shape in unresolved_dynamic_inputs(model, shape_dict, default_batch):
        dims = "[unknown rank]" if shape is None else "[" + ", ".join(str(d) for d in shape) + "]"
        found.append(Finding(DYNAMIC_INPUT, f"{name}{dims}"))
    return found


def import_onnx(
    model,
    shape_dict: Mapping[str, Sequence[int] | int] | None = None,
    *,
    freeze: Mapping[str, object] | None = None,
    default_batch: int | None = 1,
    extra_converters: dict | None = None,
    prepare: bool = True,
    fold_relax_constants: bool = True,
    **from_onnx_kwargs,
):
    """prepare -> check -> ``tvm.relax.frontend.onnx.from_onnx`` with our converters.

    ``model`` is a ModelProto or a path.  ``shape_dict``/``freeze``/``default_batch``
    go to :func:`prepare_onnx`; other keyword arguments (``keep_params_in_input``,
    ``dtype_dict``, ...) go to ``from_onnx``.  Raises only subclasses of
    ``fold_relax_constants`` folds constant-only calls left by the frontend with numpy
    (see :mod:`.relax_fold`; it saves most of ``FoldConstant``'s compile time).
    Raises only subclasses of
    :class:`ImportErrorBase` with one-line messages:
    :class:`DynamicShapeError`, :class:`UnsupportedOperatorsError` (listing every
    offending node), :class:`ConversionError` (naming the failing node and op).
    """
    from tvm.relax.frontend.onnx import from_onnx

    from .converters import patched_frontend

    model = _load(model)
    if prepare:
        try:
            model = prepare_onnx(model, shape_dict, freeze=freeze, default_batch=default_batch)
        except DynamicShapeError as exc:
            ops = unsupported_ops(model, extra_converters)
            if ops:
                extra = UnsupportedOperatorsError(ops)
                raise DynamicShapeError(exc.inputs, f"also: {extra}") from None
            raise
        except ImportErrorBase:
            raise
        except Exception as exc:  # noqa: BLE001
            raise PrepareError(f"preparing the model failed: {one_line(exc)}") from None
    ops = unsupported_ops(model, extra_converters)
    if ops:
        raise UnsupportedOperatorsError(ops)

    # shape_dict was applied by prepare (the inputs are static now)
    kwargs = dict(from_onnx_kwargs)
    if not prepare and shape_dict:
        kwargs.setdefault("shape_dict", {k: list(v) for k, v in shape_dict.items() if not isinstance(v, int)})
    sink = io.StringIO()
    try:
        with patched_frontend(extra_converters), contextlib.redirect_stdout(sink), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = from_onnx(model, **kwargs)
    except ImportErrorBase:
        raise
    except Exception as exc:  # noqa: BLE001 - errors outside a converter
        printed = sink.getvalue()
        op = None
        if printed.startswith("Error converting operator "):
            op = printed[len("Error converting operator ") :].split(",", 1)[0]
        raise ConversionError(op, None, one_line(exc)) from None
    if fold_relax_constants and not kwargs.get("keep_params_in_input"):
        from .relax_fold import fold_constants_numpy

        try:
            mod = fold_constants_numpy(mod)
        except Exception as exc:  # noqa: BLE001 - an optimisation only
            warnings.warn(f"numpy constant folding skipped: {one_line(exc)}", stacklevel=2)
    return mod
