"""Pre-flight checks and the conversion step: a prepared ONNX ModelProto -> tvm.IRModule.

* :func:`find_unsupported` / :func:`check_report`: what prevents import, in milliseconds (no TVM
  conversion, no compilation).
* :func:`convert`: check -> ``tvm.relax.frontend.onnx.from_onnx`` with the extra converters ->
  numpy folding of constant-only calls, on a model that :func:`~.prepare.prepare_onnx` already prepared
  (the whole import is :func:`forgekit.importer.import_onnx`).

Only :mod:`.converters` and :mod:`.relax_fold` need TVM; they are imported when used.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

import onnx

from .errors import (
    ConversionError,
    DynamicShapeError,
    ImportErrorBase,
    UnsupportedOperatorsError,
    fmt_shape,
    one_line,
)
from .prepare import _pin_inputs, iter_named_nodes, prepare_onnx

#: op_type used in :func:`find_unsupported` results for a dynamic input.
DYNAMIC_INPUT = "<dynamic input>"
#: domains whose ops are looked up by op_type in the convert map (TVM ignores domains).
KNOWN_DOMAINS = ("", "ai.onnx", "com.microsoft", "ai.onnx.ml")


class Finding(NamedTuple):
    """One reason a model cannot be imported: ``(op_type, node_name)``.

    ``op_type`` is the ONNX op type, ``domain.OpType`` for a non-default domain, or
    :data:`DYNAMIC_INPUT` (then ``node_name`` is ``"input[dims]"``).
    """

    op_type: str
    node_name: str


def _load(model: Any) -> onnx.ModelProto:
    """A ModelProto from a ModelProto, a path or bytes (forgekit's one-line load errors)."""
    if isinstance(model, onnx.ModelProto):
        return model
    from .load import load_onnx

    return load_onnx(model)[0]


def op_label(node: onnx.NodeProto) -> str:
    """``OpType`` for the default domain, else ``domain.OpType`` (e.g. ``com.microsoft.FusedConv``)."""
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def supported_op_types(extra: dict | None = None) -> set[str]:
    """Op types TVM's Relax ONNX frontend plus the importer's converters can convert (imports TVM)."""
    from .converters import DIRECTLY_HANDLED, full_convert_map

    return set(full_convert_map(extra)) | set(DIRECTLY_HANDLED)


def unsupported_ops(model: onnx.ModelProto, extra: dict | None = None) -> list[Finding]:
    """Every node (If/Loop/Scan bodies included) whose op has no converter, in graph order."""
    known = supported_op_types(extra)
    out = []
    for node, name in iter_named_nodes(model.graph):
        if node.domain not in KNOWN_DOMAINS or node.op_type not in known:
            out.append(Finding(op_label(node), name))
    return out


def unresolved_dynamic_inputs(
    model: onnx.ModelProto,
    shape_dict: Mapping | None = None,
    default_batch: int | None = 1,
) -> list[tuple[str, list | None]]:
    """Inputs that would stay dynamic after pinning with ``shape_dict``/``default_batch``."""
    m = onnx.ModelProto()
    m.ir_version = model.ir_version
    m.graph.input.extend(model.graph.input)
    m.graph.initializer.extend(  # only the names matter (initializers listed as inputs are not inputs)
        onnx.TensorProto(name=t.name) for t in model.graph.initializer
    )
    try:
        _pin_inputs(m, shape_dict, default_batch, allow_dynamic=False, allow_static_override=True)
    except DynamicShapeError as exc:
        return exc.inputs
    return []


def find_unsupported(
    model: Any,
    shape_dict: Mapping | None = None,
    *,
    default_batch: int | None = 1,
    extra_converters: dict | None = None,
) -> list[Finding]:
    """List what prevents import, without converting or compiling anything.

    Returns ``(op_type, node_name)`` for every node whose operator neither TVM's frontend nor this
    package can convert (nodes in If/Loop bodies included; ops of another domain show as
    ``"domain.Op"``), followed by one ``("<dynamic input>", "name[dims]")`` entry per input that
    would still be dynamic given ``shape_dict`` (input name -> dims, or symbol -> int) when a symbolic
    *leading* dim of a rank >= 2 input counts as the batch (``default_batch``; ``None``: every symbolic
    dim counts).  An empty list means the model should import.
    """
    model = _load(model)
    found = unsupported_ops(model, extra_converters)
    for name, shape in unresolved_dynamic_inputs(model, shape_dict, default_batch):
        found.append(Finding(DYNAMIC_INPUT, f"{name}{fmt_shape(shape)}"))
    return found


def check_report(model: Any, shape_dict: Mapping | None = None) -> dict[str, list[dict[str, Any]]]:
    """JSON-ready pre-flight report (what ``forgekit inspect --check`` prints).

    ``model`` is a path, bytes or ``onnx.ModelProto``; ``shape_dict`` maps input names to dims (or
    ``dim_param`` symbols to ints), as for :func:`forgekit.from_onnx`.  Returns::

        {"unsupported": [{"op": "Loop", "node": "loop_1"}, ...],
         "dynamic_inputs": [{"name": "tokens", "shape": [1, "seq"]}, ...]}

    ``unsupported`` lists every node no converter handles (subgraphs included, graph order).
    ``dynamic_inputs`` lists the inputs with a symbolic dimension other than a leading batch dim of a
    rank >= 2 input, once ``shape_dict`` is applied; forgekit keeps such a batch dim symbolic, but
    other dims usually have to be pinned (RNN unrolling, Reshape/Expand need static shapes).  Both
    empty means the model should import.  Raises ``ModelLoadError``/``UsageError`` (one line) for an
    unreadable model or a ``shape_dict`` that names no input or symbol.
    """
    from .load import normalize_shape_dict

    model = _load(model)
    pinned = normalize_shape_dict(model, dict(shape_dict) if shape_dict else None)
    unsupported = [{"op": f.op_type, "node": f.node_name} for f in unsupported_ops(model)]
    dynamic = [{"name": name, "shape": None if shape is None else list(shape)}
               for name, shape in unresolved_dynamic_inputs(model, pinned, 1)]
    return {"unsupported": unsupported, "dynamic_inputs": dynamic}


def convert(
    model: onnx.ModelProto,
    *,
    extra_converters: dict | None = None,
    fold_relax_constants: bool = True,
    where: str | None = None,
    declared: Mapping[str, int] | None = None,
    **from_onnx_kwargs: Any,
):
    """check -> ``from_onnx`` (with the extra converters) -> numpy fold, for a *prepared* model.

    ``from_onnx_kwargs`` (``shape_dict``, ``dtype_dict``, ``keep_params_in_input`` ...) go to
    ``tvm.relax.frontend.onnx.from_onnx``.  ``where`` (e.g. ``"'model.onnx'"``) words the errors.
    ``declared``: tensor -> rank as the model was exported (preparation forgets declared shapes; an axis-less
    Squeeze on symbolic dims is read against them, :mod:`.converters.squeeze`); None: ``model``'s own.
    Raises :class:`UnsupportedOperatorsError` (every offending node at once) or
    :class:`ConversionError` (naming the failing node and op); never a raw TVM traceback.
    """
    from tvm.relax.frontend.onnx import from_onnx

    from .converters import loop, patched_frontend
    from .converters.branches import runtime_failing_branches
    from .converters.squeeze import declared_shapes

    ops = unsupported_ops(model, extra_converters)
    if ops:
        raise UnsupportedOperatorsError(ops, where)
    sink = io.StringIO()

    def import_body(body: onnx.ModelProto, shapes: Mapping[str, Any]) -> Any:
        """A Loop body, prepared and converted like a model of its own (see converters/loop.py)."""
        prepared = prepare_onnx(body, allow_dynamic=True, default_batch=None)
        return convert(prepared, extra_converters=extra_converters, where=where, shape_dict={
            name: [d if isinstance(d, int) else symbols.setdefault(d, tvm.tirx.Var(d, "int64")) for d in dims]
            for name, dims in shapes.items()})

    import tvm

    symbols: dict[str, Any] = {}
    token = loop.set_subgraph_importer(list(model.opset_import), import_body)
    try:
        with patched_frontend(extra_converters), runtime_failing_branches(model), \
                declared_shapes(model, declared) as squeezes, contextlib.redirect_stdout(sink), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = from_onnx(model, **from_onnx_kwargs)
        squeezes.raise_pins()
    except ConversionError as exc:
        raise (exc.with_context(where) if where else exc) from None
    except ImportErrorBase:
        raise
    except Exception as exc:  # noqa: BLE001 - errors outside a converter
        printed = sink.getvalue()
        op = None
        if printed.startswith("Error converting operator "):
            op = printed[len("Error converting operator "):].split(",", 1)[0]
        raise ConversionError(op, None, one_line(exc), where=where) from None
    finally:
        loop.reset_subgraph_importer(token)
    if fold_relax_constants and not from_onnx_kwargs.get("keep_params_in_input"):
        from ..passes.numpy_fold import fold_constants_numpy

        try:
            mod = fold_constants_numpy(mod)
        except Exception as exc:  # noqa: BLE001 - an optimisation only
            warnings.warn(f"numpy constant folding skipped: {one_line(exc)}", stacklevel=2)
    return mod
