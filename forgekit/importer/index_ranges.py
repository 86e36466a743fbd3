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
#: ops whose second input indexes an axis of their first
_INDEXING = {"Gather", "GatherElements", "GatherND", "ScatterElements", "ScatterND"}
_INT_TYPES = {onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64,
              onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64}


def index_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """Integer graph input -> the least exclusive upper bound of the axes it indexes (inputs that index
    nothing the graph states a static size for are absent)."""
    constants = {t.name: t for t in model.graph.initializer}
    ints = [vi.name for vi in model.graph.input
            if vi.name not in constants and vi.type.tensor_type.elem_type in _INT_TYPES]
    if not ints:  # most vision models: no shape inference over their weights
        return {}
    found = _bounds(model.graph, ints, constants)
    if any(None in sizes for sizes in found.values()):
        # a table the graph states no shape for (the output of a node): shape inference, only then, since it
        # copies the whole model
        try:
            found = _bounds(onnx.shape_inference.infer_shapes(model, strict_mode=False).graph, ints, constants)
        except Exception:  # noqa: BLE001 - an uninferable model keeps what its initializers and inputs state
            pass
    return {name: min(known) for name, sizes in found.items() if (known := [s for s in sizes if s])}


def _bounds(graph: onnx.GraphProto, names: list[str],
            constants: dict[str, onnx.TensorProto]) -> dict[str, list[int | None]]:
    """Per input of ``names``, the size of every axis it indexes (None: not static in ``graph``)."""
    shapes = {vi.name: value_shape(vi) for vi in [*graph.input, *graph.value_info, *graph.output]}
    constants = dict(constants)
    shapes.update({name: list(t.dims) for name, t in constants.items()})
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = node.attribute[0].t
            shapes[node.output[0]] = list(node.attribute[0].t.dims)
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for slot, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, slot))
    return {name: list(_bounds_from(name, readers, shapes, constants, set())) for name in names}


def _bounds_from(name: str, readers: dict[str, list[tuple[onnx.NodeProto, int]]], shapes: dict[str, list | None],
                 constants: dict[str, onnx.TensorProto], seen: set[str]) -> Iterator[int | None]:
    """The sizes of the axes the values of ``name`` index (None where not static), following them through
    pass-through ops."""
    if name in seen:
        return
    seen.add(name)
    for node, slot in readers.get(name, []):
        if node.op_type in _PASS_THROUGH and (slot == 0 or node.op_type == "Concat"):
            for out in node.output:
                yield from _bounds_from(out, readers, shapes, constants, seen)
        elif (slot == 1 and node.op_type in _INDEXING) or (node.op_type == "OneHot" and slot == 0):
            yield _indexed_size(node, shapes, constants)


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
