"""ONNX ``Loop`` bodies made self-contained before import (the converter is :mod:`.converters.loop`).

A Loop body may read any value of the enclosing graph by name, and exporters pass weights through a loop
as loop-carried values that the body returns unchanged (paddle2onnx's SLANet table recognizer carries 16
weight matrices through its 501-step decoder that way).  The converter turns the body into a Relax
function of its declared inputs only, so here, on the ONNX graph, before conversion:

* a constant the body reads from outside becomes an initializer of the body;
* a non-constant outer value becomes an extra loop-carried value that the body passes through;
* a loop-carried value that the body passes through unchanged and whose initial value is a constant
  becomes an initializer of the body as well: the body's matmuls then see constant weights (packed at
  compile time) instead of function parameters.

Why not onnx's or onnxscript's tools: ``onnx.compose`` and onnxscript's optimizer inline functions and
fold constants but neither closes a Loop body over its outer scope.
"""

from __future__ import annotations

import onnx
from onnx import helper

from .onnx_utils import _subgraphs


def _defined(graph: onnx.GraphProto) -> set[str]:
    return ({i.name for i in graph.input} | {t.name for t in graph.initializer}
            | {o for n in graph.node for o in n.output if o})


def outer_names(graph: onnx.GraphProto) -> list[str]:
    """Names ``graph`` (and the subgraphs inside it) reads but does not define, in first-use order."""
    own = _defined(graph)
    seen: dict[str, None] = {}
    for node in graph.node:
        for name in node.input:
            if name and name not in own:
                seen.setdefault(name)
        for sg in _subgraphs(node):
            for name in outer_names(sg):
                if name not in own:
                    seen.setdefault(name)
    for out in graph.output:
        if out.name not in own:
            seen.setdefault(out.name)
    return list(seen)


def _body(node: onnx.NodeProto) -> onnx.GraphProto:
    return next(a.g for a in node.attribute if a.name == "body")


def _value_info(name: str, types: dict[str, onnx.TypeProto]) -> onnx.ValueInfoProto:
    vi = onnx.ValueInfoProto(name=name)
    if name in types:
        vi.type.CopyFrom(types[name])
    return vi


def _close_loop(graph: onnx.GraphProto, node: onnx.NodeProto, consts: dict[str, onnx.TensorProto],
                types: dict[str, onnx.TypeProto], used_names: set[str]) -> None:
    body = _body(node)
    n_carried = len(node.input) - 2
    # 1. outer reads: constants in, other values carried through
    for name in outer_names(body):
        if name in consts:
            body.initializer.append(consts[name])
            continue
        inner = f"{name}__loop_in"
        final = f"{node.name}__{name}__final"
        while final in used_names:
            final += "_"
        used_names.add(final)
        body.input.insert(2 + n_carried, _value_info(inner, types))
        body.output.insert(1 + n_carried, _value_info(inner, types))
        node.input.append(name)
        node.output.insert(n_carried, final)
        _rename_reads(body, name, inner)
        n_carried += 1
    # 2. constant pass-throughs become initializers of the body
    drop = []
    for k in range(n_carried):
        init, b_in, b_out = node.input[2 + k], body.input[2 + k].name, body.output[1 + k].name
        if b_in == b_out and init in consts:
            tensor = onnx.TensorProto()
            tensor.CopyFrom(consts[init])
            tensor.name = b_in
            body.initializer.append(tensor)
            drop.append(k)
    for k in reversed(drop):
        final = node.output[k] if k < len(node.output) else ""
        if final:  # the loop's final value of a constant pass-through is that constant
            for other in graph.node:
                for j, name in enumerate(other.input):
                    if name == final:
                        other.input[j] = node.input[2 + k]
            for j, out in enumerate(graph.output):
                if out.name == final:
                    graph.node.append(helper.make_node("Identity", [node.input[2 + k]], [final]))
        del node.input[2 + k]
        del body.input[2 + k]
        del body.output[1 + k]
        del node.output[k]


def _rename_reads(graph: onnx.GraphProto, old: str, new: str) -> None:
    if old in _defined(graph):
        return  # shadowed here
    for node in graph.node:
        for j, name in enumerate(node.input):
            if name == old:
                node.input[j] = new
        for sg in _subgraphs(node):
            _rename_reads(sg, old, new)
    for out in graph.output:
        if out.name == old:
            out.name = new


def close_loops(model: onnx.ModelProto) -> None:
    """Make every top-level ``Loop`` body read only its own inputs and initializers (in place)."""
    graph = model.graph
    if not any(n.op_type == "Loop" for n in graph.node):
        return
    consts = {t.name: t for t in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant" and n.output and n.attribute and n.attribute[0].name == "value":
            tensor = onnx.TensorProto()
            tensor.CopyFrom(n.attribute[0].t)
            tensor.name = n.output[0]
            consts[n.output[0]] = tensor
    types = {vi.name: vi.type for vi in list(graph.value_info) + list(graph.input) + list(graph.output)}
    for name, tensor in consts.items():
        types.setdefault(name, helper.make_tensor_type_proto(tensor.data_type, list(tensor.dims)))
    used = {o for n in graph.node for o in n.output} | {i.name for i in graph.input}
    for node in list(graph.node):
        if node.op_type == "Loop":
            _close_loop(graph, node, consts, types, used)


__all__ = ["close_loops", "outer_names"]
