"""Small ONNX graph helpers shared by the importer's preparation and folding steps (onnx + numpy only)."""

from __future__ import annotations

from collections.abc import Sequence

import onnx

_STD_DOMAINS = ("", "ai.onnx")


def default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in _STD_DOMAINS:
            return imp.version
    return 1


def initializer_names(graph: onnx.GraphProto) -> set[str]:
    return {t.name for t in graph.initializer}


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Real graph inputs (initializers listed as inputs are excluded)."""
    inits = initializer_names(model.graph)
    return [i for i in model.graph.input if i.name not in inits]


def value_shape(vi: onnx.ValueInfoProto) -> list | None:
    """Shape of a value as ints (static) and strings (symbol or '?'); None = unknown rank."""
    t = vi.type
    if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    dims = []
    for d in t.tensor_type.shape.dim:
        if d.HasField("dim_value") and d.dim_value >= 0:
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append("?")
    return dims


def is_static(shape: list | None) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)


def dynamic_inputs(model: onnx.ModelProto) -> list[tuple[str, list | None]]:
    """(name, shape) of every real graph input whose shape is not fully static."""
    out = []
    for vi in graph_inputs(model):
        if not vi.type.HasField("tensor_type"):
            out.append((vi.name, None))
            continue
        shp = value_shape(vi)
        if not is_static(shp):
            out.append((vi.name, shp))
    return out


def _set_shape(vi: onnx.ValueInfoProto, dims: Sequence[int]) -> None:
    tt = vi.type.tensor_type
    tt.ClearField("shape")
    tt.shape.SetInParent()
    for d in dims:
        tt.shape.dim.add().dim_value = int(d)


def _subgraphs(node: onnx.NodeProto):
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            yield from a.graphs


def iter_nodes(graph: onnx.GraphProto):
    """All nodes, including those inside If/Loop/Scan bodies (depth first)."""
    for n in graph.node:
        yield n
        for g in _subgraphs(n):
            yield from iter_nodes(g)
