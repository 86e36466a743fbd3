"""ONNX Squeeze without ``axes`` on a tensor with symbolic dimensions: its rank from the declared shapes.

Without ``axes`` (an absent attribute before opset 13, no second input from 13 on) Squeeze removes every
dimension of size 1.  onnxruntime decides that at run time, so the output's *rank* depends on the sizes:
PLCMOS v2 (PyTorch 1.11, ``squeeze()`` on a ``[batch_size, 1]`` score) returns shape ``()`` at batch 1 and
``(2,)`` at batch 2, while its graph declares the output ``{}`` (it was traced at batch 1).  ONNX shape
inference gives up there (no output shape), and TVM's converter emitted ``squeeze(x, axis=None)`` of
unknown rank, which failed later, outside the importer ("emit_te now only supports Tensor that has
ShapeExpr shape", exit 6), even when the output was all the model computed.

A compiled artifact has one output rank, so one reading is chosen at import, from what the exporter declared
(:func:`forgekit.importer.declared.rank_verdicts`: the Squeeze output's declared shape, or any declared shape
downstream that ONNX shape inference reaches from it):

* static dimensions of size 1 are always removed, static ones of another size always kept;
* declared as if the symbolic dimensions were removed too (the rank of the static non-1 dimensions): they
  must be 1, the size the exporter traced.  When each is an input's own symbol (``batch_size``), that symbol
  is pinned to 1 (:class:`SqueezePin`; the importer imports again with it pinned, as ``--input-shape`` would).
  A pin rather than a run-time check that the size is 1: the artifact's metadata then says 1, and the runtime
  refuses another size with its one-line input error before any kernel runs, where a check inside the graph
  would advertise a dynamic dimension that only ever works at 1.  A derived size (``frames - 2``) cannot be
  pinned that way: a conversion error (with checked advice, below);
* declared as if they were kept: they stay dynamic and only the static 1s go.  At size 1 onnxruntime still
  removes them (its rank depends on the size); forgekit keeps the declared rank, with the same values;
* no declared shape says it, or the declarations allow both or neither: a conversion error naming the node
  and the dimensions.  The importer then tries pins (:mod:`forgekit.importer.advice`: the batch to 1, others
  kept dynamic) and, when one imports, raises :class:`~forgekit.importer.errors.DynamicDimensionError` (exit 3)
  with it as the advice.

Only Squeeze nodes of the graph being converted are read this way: one inside an If branch, or in a Loop body
(whose declared shapes preparation replaced by inferred ones), gets the conversion error.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import onnx
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _fe

from ..declared import declared_ranks, rank_verdicts
from ..errors import ConversionError, ImportErrorBase, fmt_shape


class SqueezePin(ImportErrorBase):
    """The declared shapes say Squeeze nodes removed these input symbols, so they must be 1 (raised by
    :func:`forgekit.importer.check.convert` once the whole graph is converted, for every such node at once).
    :func:`forgekit.importer.pipeline.import_source` catches it and imports again with them pinned; the
    message (exit 3) is what a caller that cannot re-import (``from_onnx``'s own ``shape_dict``) sees."""

    exit_code = 3

    def __init__(self, found: list[tuple[str, list[str], str, int]]):
        node, _, shape, rank = found[0]
        self.node = node
        self.symbols = list(dict.fromkeys(s for _, symbols, _, _ in found for s in symbols))
        names = ", ".join(self.symbols)
        more = f" (and {len(found) - 1} more Squeeze node(s))" if len(found) > 1 else ""
        #: what the node needs, for an error that names the node itself
        self.detail = (f"without axes on {shape}, the model declares its result with rank {rank}, as if {names} "
                       "were 1 (onnxruntime squeezes a dimension only when it is 1 at run time, and the model was "
                       "exported at that size)")
        self.reason = f"Squeeze node '{node}'{more}: {self.detail}"
        #: how to pin them (the CLI's flags): every other dimension stays dynamic
        self.flags = " ".join(f"--input-shape {s}=1" for s in self.symbols)
        super().__init__(f"{self.reason}; pin {names} to 1 ({self.flags}), keeping the other dimensions dynamic.")


@dataclass
class SqueezeGraph:
    """The graph being converted, as :func:`_squeeze_all` reads it, and the pins it found."""

    model: onnx.ModelProto
    #: tensor -> rank, as the model was exported (before preparation forgot them)
    declared: Mapping[str, int]
    #: dim_param symbols of the graph's inputs: the sizes a pin can fix
    symbols: set[str]
    #: whether this is the imported model itself (not a Loop body converted on its own)
    top: bool
    outputs: dict[str, str] = field(default_factory=dict)
    #: (node, symbols, shape, rank) of each Squeeze that needs its symbols pinned to 1
    pins: list[tuple[str, list[str], str, int]] = field(default_factory=list)

    def raise_pins(self) -> None:
        """After the conversion (raising inside it would leave TVM's BlockBuilder half built, and it says so on
        the terminal when it is collected): one SqueezePin for every node at once, so one import again pins
        them all."""
        if self.pins:
            raise SqueezePin(self.pins)


_GRAPH: contextvars.ContextVar[SqueezeGraph | None] = contextvars.ContextVar("forgekit_squeeze_graph", default=None)


@contextlib.contextmanager
def declared_shapes(model: onnx.ModelProto, declared: Mapping[str, int] | None) -> Iterator[SqueezeGraph]:
    """Within the block, Squeeze nodes of ``model`` (prepared) are read against ``declared`` (tensor ->
    rank, from the model as exported; None: ``model``'s own).  Call ``raise_pins()`` on what it gives once
    the conversion is done."""
    symbols = {d.dim_param for vi in model.graph.input if vi.type.HasField("tensor_type")
               for d in vi.type.tensor_type.shape.dim if d.HasField("dim_param")}
    graph = SqueezeGraph(model, declared if declared is not None else declared_ranks(model.graph), symbols,
                         _GRAPH.get() is None)
    graph.outputs = {n.name: n.output[0] for n in model.graph.node if n.op_type == "Squeeze" and n.output}
    token = _GRAPH.set(graph)
    try:
        yield graph
    finally:
        _GRAPH.reset(token)


def _squeeze_all(bb, data, name: str | None):
    """The Relax value of an axis-less Squeeze of ``data`` with symbolic dims, or None (TVM's converter's
    case: a constant, a shape value, an unknown shape, no symbolic dim)."""
    if isinstance(data, (tvm.ir.GenericConst, relax.ShapeExpr)) or not isinstance(data, relax.Expr):
        return None
    ty = data.ty
    if not (isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr)):
        return None
    dims = list(ty.shape.values)
    symbolic = [i for i, d in enumerate(dims) if not isinstance(d, tvm.tirx.IntImm)]
    if not symbolic:
        return None
    ones = [i for i, d in enumerate(dims) if isinstance(d, tvm.tirx.IntImm) and int(d) == 1]
    shape = fmt_shape([_text(d) for d in dims])
    kept = len(dims) - len(ones)
    squeezed = kept - len(symbolic)
    graph = _GRAPH.get()
    tensor = graph.outputs.get(name) if graph is not None and name else None
    verdict = rank_verdicts(graph.model, tensor, [squeezed, kept], graph.declared) if tensor else {}
    names = [_text(dims[i]) for i in symbolic]
    if verdict.get(kept) is True and verdict.get(squeezed) is not True:
        return relax.op.squeeze(data, ones) if ones else data
    if verdict.get(squeezed) is True and verdict.get(kept) is not True:
        if graph.top and all(isinstance(dims[i], tvm.tirx.Var) and n in graph.symbols
                             for i, n in zip(symbolic, names)):
            graph.pins.append((name, list(dict.fromkeys(names)), shape, squeezed))
            # the declared rank, for the rest of the conversion: the import is done again with them pinned
            return relax.op.squeeze(data, sorted(ones + symbolic))
        raise ConversionError("Squeeze", name, f"without axes on {shape}, the declared shapes need "
                              f"{', '.join(names)} to be 1 (the size it was exported at), which is no input's own "
                              "dimension that a pin could set")
    said = {(None, None): "no declared shape gives its result's rank",
            (True, True): "the declared shapes allow both",
            (False, False): "the declared shapes allow neither"}.get(
        (verdict.get(squeezed), verdict.get(kept)), "the declared shapes rule out one and say nothing of the other")
    raise ConversionError("Squeeze", name, f"without axes on {shape}, it keeps {', '.join(names)} (rank {kept}) "
                          f"or removes them (rank {squeezed}) depending on their size at run time (as in "
                          f"onnxruntime), and {said}")


class Squeeze(_fe.Squeeze):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        out = None if attr.get("axes") is not None else _squeeze_all(bb, inputs[0], _name(attr))
        return out if out is not None else super()._impl_v1(bb, inputs, attr, params)

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        axes = inputs[1] if len(inputs) > 1 else None
        out = _squeeze_all(bb, inputs[0], _name(attr)) if axes is None else None
        return out if out is not None else super()._impl_v13(bb, inputs, attr, params)


def _text(dim) -> int | str:
    """A dim as the user wrote it: ``frames - 2``, not ``frames - T.int64(2)``."""
    if isinstance(dim, tvm.tirx.IntImm):
        return int(dim)
    return re.sub(r"T\.int(?:32|64)\((-?\d+)\)", r"\1", str(dim))


def _name(attr: dict) -> str | None:
    return (attr.get("tvm_custom") or {}).get("name")


CONVERTERS = {"Squeeze": Squeeze}
