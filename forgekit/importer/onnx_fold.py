"""Constant folding of ONNX graphs before import: shape inference, then every node whose inputs are all
constant is evaluated with ``onnx.reference`` (this folds the Shape/Gather/Concat/Reshape chains and turns a
0-d ``ConstantOfShape`` into a constant), ``If`` nodes with a constant condition are replaced by the taken
branch, and dead nodes and unused initializers are removed.  Quantize/Dequantize and random ops are never
folded.  Only ``onnx`` and ``numpy`` are needed.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from .onnx_utils import _STD_DOMAINS, _subgraphs, default_opset, is_static, value_shape

#: Largest tensor (elements) that constant folding may create.
MAX_FOLD_ELEMENTS = 1 << 22

_NO_FOLD = {
    "QuantizeLinear",
    "DequantizeLinear",
    "DynamicQuantizeLinear",
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
    "If",
    "Loop",
    "Scan",
}


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.value_info[:]
    for o in m.graph.output:  # declared output shapes may still carry old symbols
        if o.type.HasField("tensor_type") and o.type.tensor_type.HasField("shape"):
            o.type.tensor_type.ClearField("shape")
    try:
        return shape_inference.infer_shapes(m, check_type=False, strict_mode=False, data_prop=True)
    except Exception as exc:  # noqa: BLE001
        warnings.warn(f"ONNX shape inference failed: {str(exc).splitlines()[0][:200]}", stacklevel=3)
        return m


def _known_shapes(model: onnx.ModelProto) -> dict[str, list]:
    shapes = {}
    for vi in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        shp = value_shape(vi)
        if is_static(shp):
            shapes[vi.name] = shp
    for t in model.graph.initializer:
        shapes[t.name] = list(t.dims)
    return shapes


def _eval_node(node: onnx.NodeProto, feeds: dict[str, np.ndarray], opsets: dict[str, int]):
    from onnx.reference import ReferenceEvaluator

    inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(feeds[n].dtype), feeds[n].shape)
        for n in dict.fromkeys(i for i in node.input if i)
    ]
    outputs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output if o]
    g = helper.make_graph([node], "fold", inputs, outputs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    res = ReferenceEvaluator(m).run(None, {i.name: feeds[i.name] for i in inputs})
    if not all(isinstance(r, (np.ndarray, np.generic)) for r in res):
        raise TypeError("non-tensor output (sequence/optional): not folded")
    return [np.asarray(r) for r in res]


def _inline_if(node: onnx.NodeProto, cond: bool) -> list[onnx.NodeProto] | None:
    branch = None
    for a in node.attribute:
        if a.name == ("then_branch" if cond else "else_branch"):
            branch = a.g
    if branch is None or any(True for n in branch.node for _ in _subgraphs(n)):
        return None
    prefix = f"{node.name}__"
    local = {t.name for t in branch.initializer} | {o for n in branch.node for o in n.output if o}
    ren = {v: prefix + v for v in local}
    new_nodes = []
    for t in branch.initializer:
        arr = numpy_helper.to_array(t)
        new_nodes.append(
            helper.make_node("Constant", [], [ren[t.name]], name=prefix + t.name + "_const",
                             value=numpy_helper.from_array(arr, ren[t.name]))
        )
    for n in branch.node:
        nn = copy.deepcopy(n)
        nn.name = prefix + (n.name or n.op_type)
        for k, i in enumerate(nn.input):
            nn.input[k] = ren.get(i, i)
        for k, o in enumerate(nn.output):
            nn.output[k] = ren.get(o, o)
        new_nodes.append(nn)
    for bo, out in zip(branch.output, node.output):
        if out:
            new_nodes.append(helper.make_node("Identity", [ren.get(bo.name, bo.name)], [out], name=f"{node.name}__out_{out}"))
    return new_nodes


def _fold_once(model: onnx.ModelProto, max_elements: int) -> bool:
    graph = model.graph
    opsets = {"": default_opset(model)}
    consts: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    shapes = _known_shapes(model)
    types = {
        vi.name: helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        for vi in list(graph.value_info) + list(graph.output)
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type
    }
    changed = False
    new_nodes: list[onnx.NodeProto] = []
    new_inits: list[onnx.TensorProto] = []

    def add_const(name, arr):
        consts[name] = arr
        new_inits.append(numpy_helper.from_array(np.array(arr, copy=True, order="C"), name))

    for node in graph.node:
        ins = [i for i in node.input if i]
        if node.domain not in _STD_DOMAINS:
            new_nodes.append(node)
            continue
        op = node.op_type
        if op == "Constant" and len(node.output) == 1:
            try:
                val = _eval_node(node, {}, opsets)[0]
            except Exception:  # noqa: BLE001
                new_nodes.append(node)
                continue
            add_const(node.output[0], val)
            changed = True
            continue
        if op in ("Shape", "Size") and ins and ins[0] in shapes and ins[0] not in consts:
            shp = shapes[ins[0]]
            if op == "Size":
                add_const(node.output[0], np.array(int(np.prod(shp)), dtype=np.int64))
            else:
                start, end = 0, None
                for a in node.attribute:
                    if a.name == "start":
                        start = a.i
                    elif a.name == "end":
                        end = a.i
                add_const(node.output[0], np.array(shp[start:end] if end is not None else shp[start:], dtype=np.int64))
            changed = True
            continue
        if op == "If" and ins and ins[0] in consts:
            inl = _inline_if(node, bool(np.asarray(consts[ins[0]]).reshape(-1)[0]))
            if inl is not None:
                new_nodes.extend(inl)
                changed = True
                continue
        foldable = (
            op not in _NO_FOLD
            and not any(True for _ in _subgraphs(node))
            and all(i in consts for i in ins)
            and (ins or op in ("ConstantOfShape", "Range", "EyeLike"))
        )
        if foldable:
            try:
                outs = _eval_node(node, consts, opsets)
            except Exception:  # noqa: BLE001 - leave it to TVM
                outs = None
            if outs is not None and all(o.size <= max_elements for o in outs) and len(outs) == len(
                [o for o in node.output if o]
            ):
                for name, val in zip([o for o in node.output if o], outs):
                    if name in types and val.dtype != types[name]:
                        val = val.astype(types[name])  # reference ops may widen (e.g. to float64)
                    add_const(name, val)
                changed = True
                continue
        new_nodes.append(node)

    if not changed:
        return False
    del graph.node[:]
    graph.node.extend(new_nodes)
    graph.initializer.extend(new_inits)
    return True


def _eliminate_dead(model: onnx.ModelProto) -> None:
    graph = model.graph
    needed = {o.name for o in graph.output}

    def sub_uses(g, acc):
        for n in g.node:
            acc.update(i for i in n.input if i)
            for sg in _subgraphs(n):
                sub_uses(sg, acc)

    keep = []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output if o):
            keep.append(node)
            needed.update(i for i in node.input if i)
            for sg in _subgraphs(node):
                sub_uses(sg, needed)
    keep.reverse()
    del graph.node[:]
    graph.node.extend(keep)
    # unique initializers that are used (later duplicates win: they are the folded values)
    inits: dict[str, onnx.TensorProto] = {}
    for t in graph.initializer:
        if t.name in needed:
            inits[t.name] = t
    del graph.initializer[:]
    graph.initializer.extend(inits.values())
    # graph outputs that became constants stay as initializers (kept above)


def fold_constants(model: onnx.ModelProto, max_elements: int = MAX_FOLD_ELEMENTS, max_rounds: int = 8):
    """Shape inference + constant folding to a fixpoint; returns a new model."""
    model = _infer(model)
    for _ in range(max_rounds):
        if not _fold_once(model, max_elements):
            break
        _eliminate_dead(model)
        model = _infer(model)
    _eliminate_dead(model)
    return model
