"""The one ONNX import path: prepare -> check -> QDQ fusion -> convert -> canonicalize -> numpy fold.

``forgekit.from_onnx`` (the product), the CLI and the importer's own tests all come through
:func:`import_onnx`, so there is one set of defaults: dimensions that are not pinned stay symbolic, QDQ
conv/matmul patterns run on the integer kernels, and constant sub-graphs are folded.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping


from .. import interrupts, log
from ..description import TensorInfo
from ..errors import ForgekitError, ModelLoadError
from .errors import REPORT_HINT, ConversionError, DynamicDimensionError, ImportErrorBase, PrepareError
from .errors import UnsupportedOperatorsError
from .errors import one_line
from .load import OnnxSource, graph_inputs, graph_outputs, load_onnx, normalize_shape_dict


@dataclass
class ImportedModel:
    """A Relax module and the ONNX names and shapes of its inputs (as imported) and outputs."""

    mod: Any
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]


def import_source(source: OnnxSource, *, extra_converters: dict | None = None, advise: bool = True,
                  **from_onnx_kwargs: Any) -> ImportedModel:
    """Import a loaded model whose ``shape_dict``/``freeze`` are already validated (see :func:`import_onnx`).
    A conversion that fails with dynamic inputs gets advice that was checked by importing (``advise``)."""
    import tvm
    from tvm import relax

    from ..passes.canonicalize import canonicalize
    from ..passes.numpy_fold import fold_constants_numpy
    from .advice import checked_advice
    from .check import convert, unsupported_ops
    from .converters.squeeze import SqueezePin
    from .dataflow import dataflow_around_control_flow
    from .declared import declared_ranks
    from .prepare import prepare_onnx
    from .qdq import fuse_qdq
    from .strides import input_dim, restore_plain_inputs, stepped_symbols, unprovable_broadcast

    model = source.model
    where = f"'{source.path}'" if source.path else None
    try:
        with interrupts.watch(), log.quiet_native("import"):
            prepared = prepare_onnx(model, source.shape_dict, freeze=source.freeze, default_batch=None,
                                    allow_dynamic=True, allow_static_override=True)
    except ForgekitError:
        raise
    except Exception as exc:  # shape inference or the version converter choked on the graph
        interrupts.check(exc)
        missing = unsupported_ops(model, extra_converters)
        if missing:  # the likelier cause, and the more useful message
            raise UnsupportedOperatorsError(missing, where) from None
        raise PrepareError(f"Preparing {where or 'the model'} for import failed ({one_line(exc)}): "
                           "check it with onnx.checker or re-export it.") from exc
    missing = unsupported_ops(prepared, extra_converters)
    if missing:
        raise UnsupportedOperatorsError(missing, where)
    prepared = fuse_qdq(prepared)  # QDQ conv/matmul -> ConvInteger/MatMulInteger (the integer path)

    inputs = graph_inputs(prepared)
    symbols: dict[str, Any] = {}
    stepped = stepped_symbols(source.dynamic)  # --dynamic H=32..2048:32: H imported as 32 * H_div32
    # from_onnx wants tirx Vars for symbolic dims, never strings; one Var per symbol name.
    kwargs = dict(from_onnx_kwargs)
    kwargs.setdefault("shape_dict", {info.name: [
        d if isinstance(d, int) else
        input_dim(str(d), stepped, symbols.setdefault(str(d), tvm.tirx.Var(str(d), "int64")))
        for d in info.shape] for info in inputs})
    kwargs.setdefault("dtype_dict", {info.name: info.dtype for info in inputs})
    try:
        with interrupts.watch(), log.quiet_native("import"):
            mod = convert(prepared, extra_converters=extra_converters, fold_relax_constants=False, where=where,
                          declared=declared_ranks(model.graph), **kwargs)
            mod = relax.transform.Normalize()(restore_plain_inputs(mod, stepped))
            unprovable = unprovable_broadcast(mod)
            if unprovable:
                raise ConversionError(None, None, unprovable)
            if not kwargs.get("keep_params_in_input"):
                mod = fold_constants_numpy(canonicalize(mod))
            mod = dataflow_around_control_flow(mod)
    except ConversionError as exc:
        interrupts.check(exc)
        hint, fixed = checked_advice(source, inputs, lambda candidate: import_source(
            candidate, extra_converters=extra_converters, advise=False)) if advise and not from_onnx_kwargs else (None, False)
        if fixed:  # every operator converts, at fixed sizes: a dynamic-dimension limit, not an unsupported op
            raise DynamicDimensionError(exc.op_type, exc.node_name, exc.detail, hint, where) from None
        raise exc.with_context(where, hint) from None
    except SqueezePin as pin:  # imported again below, once this attempt's module and frames are gone
        pinned = pin.with_traceback(None)
    except ImportErrorBase:
        raise
    except Exception as exc:  # Normalize or the rewrites on what the frontend built
        interrupts.check(exc)
        raise ModelLoadError(f"TVM could not import {where or 'the model'}: {log.first_line(exc)}; "
                             f"{REPORT_HINT}.") from exc
    else:
        return ImportedModel(mod, inputs, graph_outputs(model))
    return _import_pinned(source, pinned, where, extra_converters=extra_converters, advise=advise, **from_onnx_kwargs)


def _import_pinned(source: OnnxSource, pin: Any, where: str | None, **kwargs: Any) -> ImportedModel:
    """Import again with the symbols a Squeeze removed pinned to 1 (:mod:`.converters.squeeze`), as
    ``--input-shape SYMBOL=1`` would: the artifact's inputs then say 1 and the runtime refuses other sizes."""
    ranged = [s for s in pin.symbols if s in source.dynamic]
    if ranged or "shape_dict" in kwargs or any(s in source.shape_dict for s in pin.symbols):
        what = f"--dynamic gives {', '.join(ranged)} a range" if ranged else "they cannot be pinned here"
        raise DynamicDimensionError("Squeeze", pin.node, f"{pin.detail}, but {what}",
                                    f"pin them to 1 ({pin.flags}), keeping the other dimensions dynamic", where)
    one = set(pin.symbols)
    shapes = {k: [1 if d in one else d for d in v] if isinstance(v, list) else v for k, v in source.shape_dict.items()}
    log.warn(f"{pin.reason}: {', '.join(pin.symbols)} pinned to 1, as with {pin.flags}")
    return import_source(dataclasses.replace(source, shape_dict={**shapes, **dict.fromkeys(pin.symbols, 1)}),
                         **kwargs)


def import_onnx(model: Any, shape_dict: Mapping[str, Any] | None = None, *, freeze: Mapping[str, Any] | None = None,
                extra_converters: dict | None = None, **from_onnx_kwargs: Any) -> ImportedModel:
    """Import an ONNX model (path, bytes or ``ModelProto``) into Relax.

    ``shape_dict`` pins input shapes by name (``{"x": [1, 3, 224, 224]}``; a string dim stays symbolic)
    or dimension symbols (``{"batch": 1}``); ``freeze`` turns inputs into constants
    (``{"sample_rate": 16000}``) so ``If``s and shape computations on them fold.  Other keyword arguments
    (``keep_params_in_input``...) go to TVM's ``from_onnx``.  Raises only one-line forgekit errors:
    :class:`UnsupportedOperatorsError` (every offending node at once), :class:`ConversionError` (the failing
    node and op), :class:`PrepareError`, :class:`forgekit.errors.UsageError` for a bad ``shape_dict``.
    """
    proto, path = load_onnx(model)
    source = OnnxSource(proto, normalize_shape_dict(proto, dict(shape_dict) if shape_dict else None), path,
                        dict(freeze or {}))
    return import_source(source, extra_converters=extra_converters, **from_onnx_kwargs)


__all__ = ["ImportedModel", "import_onnx", "import_source"]

