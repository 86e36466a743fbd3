"""ONNX ``Loop`` bodies made self-contained before import (the converter is :mod:`.converters.loop`), and
``Scan`` rewritten as ``Loop``.

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


def _ints(node: onnx.NodeProto, name: str, count: int, default: int) -> list[int]:
    values = next((list(a.ints) for a in node.attribute if a.name == name), None)
    return values if values else [default] * count


def _scan_as_loop(node: onnx.NodeProto, ranks: dict[str, int]) -> list[onnx.NodeProto]:
    """A ``Scan`` as the nodes of an equivalent ``Loop``: the trip count is the scan inputs' length, each
    iteration ``Gather`` s its slice of every scan input (from the end for a reverse direction), and the
    stacked scan outputs are reversed and transposed into place afterwards."""
    body = _body(node)
    n_scan_in = next(a.i for a in node.attribute if a.name == "num_scan_inputs")
    n_state = len(node.input) - n_scan_in
    n_scan_out = len(body.output) - n_state
    in_axes = _ints(node, "scan_input_axes", n_scan_in, 0)
    in_dirs = _ints(node, "scan_input_directions", n_scan_in, 0)
    out_axes = _ints(node, "scan_output_axes", n_scan_out, 0)
    out_dirs = _ints(node, "scan_output_directions", n_scan_out, 0)
    p = f"{node.name}__"
    scan_inputs = list(node.input[n_state:])
    for j, axis in enumerate(in_axes):
        if axis < 0:
            if scan_inputs[j] not in ranks:
                raise ValueError(f"Scan '{node.name}': a negative scan_input_axes needs the input's rank")
            in_axes[j] = axis + ranks[scan_inputs[j]]
    length = helper.make_node("Shape", [scan_inputs[0]], [p + "shape"])
    count = helper.make_node("Gather", [p + "shape", p + "axis0"], [p + "len"], axis=0)
    axis0 = helper.make_node("Constant", [], [p + "axis0"], value=helper.make_tensor("a", onnx.TensorProto.INT64,
                                                                                      [], [in_axes[0]]))
    loop_body = onnx.GraphProto()
    loop_body.CopyFrom(body)
    slice_inputs = loop_body.input[n_state:]
    steps = [helper.make_node("Identity", [p + "cond"], [p + "cond_out"]),
             helper.make_node("Sub", [p + "len", p + "iter"], [p + "left"]),
             helper.make_node("Sub", [p + "left", p + "one"], [p + "rev"]),
             helper.make_node("Constant", [], [p + "one"], value=helper.make_tensor("o", onnx.TensorProto.INT64,
                                                                                     [], [1]))]
    for j, vi in enumerate(slice_inputs):
        index = p + ("rev" if in_dirs[j] else "iter")
        steps.append(helper.make_node("Gather", [scan_inputs[j], index], [vi.name], axis=in_axes[j]))
    nodes = list(loop_body.node)
    del loop_body.node[:]
    loop_body.node.extend(steps + nodes)
    del loop_body.input[n_state:]
    loop_body.input.insert(0, helper.make_tensor_value_info(p + "iter", onnx.TensorProto.INT64, []))
    loop_body.input.insert(1, helper.make_tensor_value_info(p + "cond", onnx.TensorProto.BOOL, []))
    loop_body.output.insert(0, helper.make_tensor_value_info(p + "cond_out", onnx.TensorProto.BOOL, []))
    stacked = [p + f"stacked{k}" for k in range(n_scan_out)]
    loop = helper.make_node("Loop", [p + "len", "", *node.input[:n_state]],
                            [*node.output[:n_state], *stacked], body=loop_body, name=node.name)
    out = [axis0, length, count, loop]
    for k, (axis, direction) in enumerate(zip(out_axes, out_dirs)):
        name, final = stacked[k], node.output[n_state + k]
        if direction:  # stacked last-first: reverse along the new axis
            bounds = {"start": -1, "end": -(2**63), "axis": 0, "step": -1}
            for part, value in bounds.items():
                out.append(helper.make_node("Constant", [], [f"{name}_{part}"], value=helper.make_tensor(
                    part, onnx.TensorProto.INT64, [1], [value])))
            out.append(helper.make_node("Slice", [name, *(f"{name}_{part}" for part in bounds)], [name + "_rev"]))
            name += "_rev"
        if axis:
            elem = body.output[n_state + k].type.tensor_type
            if not elem.HasField("shape"):
                raise ValueError(f"Scan '{node.name}': scan_output_axes needs the body output's rank")
            rank = len(elem.shape.dim) + 1
            axis = axis + rank if axis < 0 else axis
            perm = list(range(1, axis + 1)) + [0] + list(range(axis + 1, rank))
            out.append(helper.make_node("Transpose", [name], [final], perm=perm))
        else:
            out.append(helper.make_node("Identity", [name], [final]))
    return out


def scans_to_loops(model: onnx.ModelProto) -> None:
    """Every top-level ``Scan`` as a ``Loop`` (in place): one converter serves both."""
    graph = model.graph
    if not any(n.op_type == "Scan" for n in graph.node):
        return
    ranks = {vi.name: len(vi.type.tensor_type.shape.dim) for vi in
             list(graph.value_info) + list(graph.input) + list(graph.output)
             if vi.type.tensor_type.HasField("shape")}
    ranks.update({t.name: len(t.dims) for t in graph.initializer})
    nodes = []
    for node in graph.node:
        nodes.extend(_scan_as_loop(node, ranks) if node.op_type == "Scan" else [node])
    del graph.node[:]
    graph.node.extend(nodes)


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
