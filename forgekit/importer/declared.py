"""What an ONNX graph's declared shapes say about the rank of one of its tensors (``onnx`` only).

An exporter declares the shapes it saw while tracing: the graph outputs always, intermediate values
sometimes (``value_info``).  Where a value's rank cannot be computed from the inputs (``Squeeze`` without
``axes`` on a symbolic dimension: onnxruntime removes whatever is 1 *at run time*, so ONNX shape inference
gives up on it), those declarations are the only record of what the exporter meant.  :func:`rank_verdicts`
asks them about a hypothesis: the value is given each candidate rank, ONNX's own shape inference runs over
the part of the graph that reads it (forward only: a declared output two elementwise ops further down
still answers, as PyTorch's ``squeeze() -> sigmoid -> * 4 + 1`` traced at batch 1 shows), and every declared
shape it reaches is compared.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import onnx
from onnx import helper

from .onnx_utils import _subgraphs

#: initializers up to this many elements go into the probe with their values (Reshape's shape input,
#: Expand's, axes), larger ones as typed inputs (their values change no rank)
_VALUE_LIMIT = 4096


def _rank(vi: onnx.ValueInfoProto) -> int | None:
    t = vi.type
    if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    return len(t.tensor_type.shape.dim)


def _names_read(node: onnx.NodeProto) -> set[str]:
    """The node's inputs and every name its bodies read (an over-approximation of outer-scope reads)."""
    names = {i for i in node.input if i}
    for g in _subgraphs(node):
        for inner in g.node:
            names |= _names_read(inner)
    return names


def _readers(graph: onnx.GraphProto, tensor: str) -> list[onnx.NodeProto]:
    """Every node of ``graph`` that depends on ``tensor``, in graph order."""
    reached, out = {tensor}, []
    for node in graph.node:  # ONNX graphs are topologically sorted
        if _names_read(node) & reached:
            out.append(node)
            reached.update(o for o in node.output if o)
    return out


def declared_ranks(graph: onnx.GraphProto) -> dict[str, int]:
    """Tensor name -> rank, for every value of ``graph`` whose shape is declared (outputs, value_info)."""
    out = {}
    for vi in [*graph.value_info, *graph.output]:
        rank = _rank(vi)
        if rank is not None:
            out[vi.name] = rank
    return out


def _probe(model: onnx.ModelProto, tensor: str, rank: int, readers: Sequence[onnx.NodeProto],
           targets: Iterable[str]) -> onnx.ModelProto:
    """A model of ``readers`` alone whose input ``tensor`` has ``rank`` unknown dimensions, and whose
    outputs are ``targets`` with no shape (for inference to fill in)."""
    g = model.graph
    typed = {vi.name: vi for vi in [*g.input, *g.value_info, *g.output]}
    inits = {t.name: t for t in g.initializer}
    produced = {o for n in readers for o in n.output}
    inputs, initializers = [], []
    for name in sorted(set().union(*(_names_read(n) for n in readers)) - produced):
        if name == tensor:
            elem = typed[name].type.tensor_type.elem_type if name in typed else onnx.TensorProto.FLOAT
            vi = helper.make_tensor_value_info(name, elem, [None] * rank)
            inputs.append(vi)
        elif name in inits and _size(inits[name]) <= _VALUE_LIMIT:
            initializers.append(inits[name])
        elif name in inits:
            inputs.append(helper.make_tensor_value_info(name, inits[name].data_type, list(inits[name].dims)))
        elif name in typed:
            inputs.append(typed[name])
    outputs = [onnx.ValueInfoProto(name=t) for t in targets]  # no type: inference fills it in
    graph = helper.make_graph(list(readers), "probe", inputs, outputs, initializers)
    probe = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    probe.functions.extend(model.functions)
    return probe


def _size(t: onnx.TensorProto) -> int:
    n = 1
    for d in t.dims:
        n *= d
    return n


def rank_verdicts(model: onnx.ModelProto, tensor: str, candidates: Sequence[int],
                  declared: Mapping[str, int]) -> dict[int, bool | None]:
    """For each candidate rank of ``tensor`` (a value of ``model``'s top graph): True when the ``declared``
    ranks it reaches agree with it (at least one), False when one contradicts it, None when none is reached
    (no declared shape depends on it, or ONNX shape inference could not follow it there).

    ``declared`` comes from the model as exported (:func:`declared_ranks` of its graph), not from ``model``:
    the importer's preparation forgets the declared shapes so that pinned inputs are inferred anew."""
    g = model.graph
    if tensor in declared:
        return {r: r == declared[tensor] for r in candidates}
    readers = _readers(g, tensor)
    targets = [o for n in readers for o in n.output if o in declared]
    if not targets:
        return dict.fromkeys(candidates)
    out: dict[int, bool | None] = {}
    for rank in candidates:
        try:  # non-strict: a node whose inference fails on this hypothesis leaves its outputs unknown
            inferred = onnx.shape_inference.infer_shapes(_probe(model, tensor, rank, readers, targets),
                                                         data_prop=True)
        except Exception:  # noqa: BLE001 - a graph the probe or the inference cannot take: no answer
            out[rank] = None
            continue
        ranks = {vi.name: _rank(vi) for vi in [*inferred.graph.value_info, *inferred.graph.output]}
        compared = [ranks[t] == declared[t] for t in targets if ranks.get(t) is not None]
        out[rank] = all(compared) if compared else None
    return out


__all__ = ["declared_ranks", "rank_verdicts"]
