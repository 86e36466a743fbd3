"""An ONNX graph as TIDL's import sees it: pinned shapes, constants folded away, producers and consumers.

TI's import works on the ONNX graph (it is an onnxruntime execution provider), after shape inference, with
constant sub-graphs folded (TI's tidl-onnx-model-optimizer and onnxsim do this first).  This module gives the
planner (:mod:`.tidl`) and the rules (:mod:`.tidl_rules`) that view: every node's input/output shapes, which
tensors are constants (initializers, ``Constant`` nodes and anything computed only from them), and each
convolution/matmul's multiply-accumulates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class OnnxGraph:
    model: Any
    nodes: list[Any]  # nodes that compute on variable data, in graph (topological) order
    folded: list[Any]  # nodes computed only from constants, Identity and Dropout: gone before TIDL's import
    shapes: dict[str, tuple[int, ...]]
    const_values: dict[str, np.ndarray]
    constants: set[str]
    producer: dict[str, Any] = field(default_factory=dict)
    consumers: dict[str, list[Any]] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    def shape(self, name: str) -> tuple[int, ...] | None:
        return self.shapes.get(name)

    def attr(self, node: Any, name: str, default: Any = None) -> Any:
        from onnx import helper

        for a in node.attribute:
            if a.name == name:
                return helper.get_attribute_value(a)
        return default

    def variable_inputs(self, node: Any) -> list[str]:
        return [i for i in node.input if i and i not in self.constants]

    def node_name(self, node: Any) -> str:
        """TI's deny/allow lists name a node by its name, or by its first output when it has none."""
        return node.name or node.output[0]


def _pin_inputs(model: Any, shape_dict: dict[str, list[int]] | None) -> Any:
    import onnx

    pinned = onnx.ModelProto()
    pinned.CopyFrom(model)
    inits = {i.name for i in pinned.graph.initializer}
    for vi in pinned.graph.input:
        if vi.name in inits:
            continue
        wanted = (shape_dict or {}).get(vi.name)
        dims = vi.type.tensor_type.shape.dim
        for axis, dim in enumerate(dims):
            value = wanted[axis] if wanted is not None else (dim.dim_value if dim.HasField("dim_value") else 1)
            dim.Clear()
            dim.dim_value = int(value)  # TIDL imports static shapes: unpinned dims read as 1 (batch)
    return pinned


def _macs(node: Any, g: OnnxGraph) -> int:
    out = g.shape(node.output[0]) if node.output else None
    if not out:
        return 0
    volume = int(np.prod(out))
    if node.op_type in ("Conv", "ConvTranspose") and len(node.input) > 1:
        w = g.shape(node.input[1])
        if not w:
            return 0
        per = int(np.prod(w[1:]))  # Conv: (O, I/groups, kh, kw)
        if node.op_type == "ConvTranspose":  # (I, O/groups, kh, kw): each input pixel feeds O/groups * k outputs
            x = g.shape(node.input[0])
            return int(np.prod(x)) * per if x else 0
        return volume * per
    if node.op_type in ("MatMul", "Gemm"):
        a = g.shape(node.input[0])
        if not a:
            return 0
        k = a[0] if node.op_type == "Gemm" and g.attr(node, "transA", 0) else a[-1]
        return volume * k
    return 0


def load_graph(model: Any, shape_dict: dict[str, list[int]] | None = None) -> OnnxGraph:
    """``model`` with its inputs pinned (``shape_dict``; other dynamic dims read as 1) and shapes inferred."""
    import onnx
    from onnx import numpy_helper

    pinned = _pin_inputs(model, shape_dict)
    try:
        inferred = onnx.shape_inference.infer_shapes(pinned, data_prop=True)
    except Exception:  # noqa: BLE001 - a model onnx cannot infer still gets a plan, with fewer shapes
        inferred = pinned
    graph = inferred.graph
    shapes: dict[str, tuple[int, ...]] = {}
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        dims = vi.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims) and vi.type.tensor_type.HasField("shape"):
            shapes[vi.name] = tuple(int(d.dim_value) for d in dims)
    const_values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for name, value in const_values.items():
        shapes[name] = tuple(value.shape)
    constants = set(const_values)
    nodes, folded = [], []
    alias: dict[str, str] = {}  # outputs of Identity/Dropout -> their input (onnxruntime removes them first)
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name in alias:
                node.input[k] = alias[name]
        if node.op_type in ("Identity", "Dropout") and node.input and node.input[0] not in constants:
            alias[node.output[0]] = node.input[0]
            folded.append(node)
            continue
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    const_values[node.output[0]] = numpy_helper.to_array(a.t)
                    shapes[node.output[0]] = tuple(const_values[node.output[0]].shape)
            constants.update(node.output)
            folded.append(node)
        elif all(not i or i in constants for i in node.input) and node.op_type not in ("RandomNormal", "RandomUniform"):
            constants.update(node.output)  # computed from constants only: folded before TIDL's import
            folded.append(node)
        else:
            nodes.append(node)
    g = OnnxGraph(inferred, nodes, folded, shapes, const_values, constants,
                  inputs=[i.name for i in graph.input if i.name not in const_values],
                  outputs=[alias.get(o.name, o.name) for o in graph.output])
    for node in nodes:
        for out in node.output:
            g.producer[out] = node
        for i in node.input:
            g.consumers.setdefault(i, []).append(node)
    return g


def macs(node: Any, g: OnnxGraph) -> int:
    """Multiply-accumulates of a Conv, ConvTranspose, MatMul or Gemm node (0 for anything else)."""
    return _macs(node, g)
