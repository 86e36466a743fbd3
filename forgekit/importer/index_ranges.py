"""The values an integer input may take, read off the graph: an input that ends up as the indices of a
Gather (an embedding lookup), GatherElements/GatherND, a Scatter or the indices of a OneHot indexes the
axis it selects along, so only ``[0, size)`` of that axis is a meaningful value.

The artifact records it (``metadata.json``, an input's ``values``) so that the inputs ``run --random``,
``verify`` and ``bench`` draw stay inside the table: integers in [0, 10) on a 2-row embedding read past
its end (garbage in forgekit, an error in onnxruntime), which said nothing about the artifact.
"""

from __future__ import annotations

from typing import Iterator

import onnx
from onnx import numpy_helper

from .onnx_utils import value_shape

#: ops that pass their first input's values through unchanged (only the shape or the dtype changes), so an
#: index stays an index of the same table after them
_PASS_THROUGH = {"Cast", "Unsqueeze", "Reshape", "Squeeze", "Identity", "Flatten", "Expand", "Transpose",
                 "Slice", "Tile", "Concat", "Split", "CastLike"}
_INT_TYPES = {onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64,
              onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64}


def index_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """Integer graph input -> the least exclusive upper bound of the axes it indexes (inputs that index
    nothing the graph states a static size for are absent)."""
    graph = model.graph
    try:  # shapes of intermediate tables (a Gather of a Gather's result); best effort
        graph = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    except Exception:  # noqa: BLE001 - an uninferable model still has its initializers' and inputs' shapes
        pass
    shapes = {vi.name: value_shape(vi) for vi in [*graph.input, *graph.value_info, *graph.output]}
    constants = {t.name: t for t in graph.initializer}
    shapes.update({name: list(t.dims) for name, t in constants.items()})
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = node.attribute[0].t
            shapes[node.output[0]] = list(node.attribute[0].t.dims)
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for slot, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, slot))
    bounds = {}
    for vi in graph.input:
        if vi.name in constants or vi.type.tensor_type.elem_type not in _INT_TYPES:
            continue
        found = [b for b in _bounds_from(vi.name, readers, shapes, constants, set()) if b > 0]
        if found:
            bounds[vi.name] = min(found)
    return bounds


def _bounds_from(name: str, readers: dict[str, list[tuple[onnx.NodeProto, int]]], shapes: dict[str, list | None],
                 constants: dict[str, onnx.TensorProto], seen: set[str]) -> Iterator[int]:
    """The sizes of the axes the values of ``name`` index, following them through pass-through ops."""
    if name in seen:
        return
    seen.add(name)
    for node, slot in readers.get(name, []):
        if node.op_type in _PASS_THROUGH and (slot == 0 or node.op_type == "Concat"):
            for out in node.output:
                yield from _bounds_from(out, readers, shapes, constants, seen)
        elif slot == 1 or (node.op_type == "OneHot" and slot == 0):
            size = _indexed_size(node, shapes, constants)
            if size is not None:
                yield size


def _indexed_size(node: onnx.NodeProto, shapes: dict[str, list | None],
                  constants: dict[str, onnx.TensorProto]) -> int | None:
    """The size of the axis that ``node`` indexes with its indices input, when static."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "OneHot":
        depth = constants.get(node.input[1])
        return int(numpy_helper.to_array(depth).reshape(-1)[0]) if depth is not None else None
    data = shapes.get(node.input[0])
    if not data:
        return None
    if node.op_type in ("Gather", "GatherElements", "ScatterElements"):
        axis = int(attrs.get("axis", 0))
        dims = [data[axis]] if -len(data) <= axis < len(data) else []
    elif node.op_type in ("GatherND", "ScatterND"):
        # the last indices dimension picks that many leading axes (after batch_dims): bound by the smallest
        batch = int(attrs.get("batch_dims", 0))
        indices = shapes.get(node.input[1]) or []
        depth = indices[-1] if indices and isinstance(indices[-1], int) else len(data) - batch
        dims = data[batch:batch + depth]
    else:
        return None
    sizes = [d for d in dims if isinstance(d, int)]
    return min(sizes) if sizes and len(sizes) == len(dims) else None
