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


def _clear_value_info(graph: onnx.GraphProto) -> None:
    """Forget inferred shapes here and in every subgraph: once a nested If is inlined, its old output's
    entry in the branch would outlive it and shape inference keeps stale entries instead of re-deriving."""
    del graph.value_info[:]
    for node in graph.node:
        for sg in _subgraphs(node):
            _clear_value_info(sg)


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    _clear_value_info(m.graph)
    for o in m.graph.output:  # declared output shapes may still carry old symbols
        if o.type.HasField("tensor_type") and o.type.tensor_type.HasField("shape"):
            o.type.tensor_type.ClearField("shape")
    try:
        return shape_inference.infer_shapes(m, check_type=False, strict_mode=False, data_prop=True)
    except Exception as exc:  # noqa: BLE001
        warnings.warn(f"ONNX shape inference failed: {str(exc).splitlines()[0][:200]}", stacklevel=3)
        return m


def _known_shapes(graph: onnx.GraphProto) -> dict[str, list]:
    shapes = {}
    for vi in list(graph.value_info) + list(graph.input) + list(graph.output):
        shp = value_shape(vi)
        if is_static(shp):
            shapes[vi.name] = shp
    for t in graph.initializer:
        shapes[t.name] = list(t.dims)
    return shapes


def _partial_shapes(graph: onnx.GraphProto) -> dict[str, list]:
    """Shapes with some dimension symbolic or unknown (ints and strings), by value name."""
    out = {}
    for vi in list(graph.value_info) + list(graph.input) + list(graph.output):
        shp = value_shape(vi)
        if shp is not None and not is_static(shp):
            out[vi.name] = shp
    return out


def _static_part(node: onnx.NodeProto, dims: list, consts: dict[str, np.ndarray]) -> np.ndarray | None:
    """``Gather`` or ``Slice`` of the output of a ``Shape`` node that picks only static dimensions: the
    picked dimensions as an int64 constant, else None.  ``x.shape[-1] == 1`` on ``[batch, 128, 1]`` (how
    torch exports ``squeeze(dim)``: an If on that test; Silero VAD's decoder has three) and
    ``state.shape[0]`` then fold although ``batch`` stays symbolic."""
    ins = list(node.input)
    if not all(i in consts for i in ins[1:] if i):
        return None
    if node.op_type == "Gather" and len(ins) == 2:
        index = np.asarray(consts[ins[1]]).astype(np.int64)
        if index.size and (index.min() < -len(dims) or index.max() >= len(dims)):
            return None
        picked = np.asarray(np.asarray(dims, dtype=object)[index], dtype=object)
    elif node.op_type == "Slice" and len(ins) >= 3:
        starts, ends = (int(np.asarray(consts[i]).reshape(-1)[0]) for i in ins[1:3])
        axes = [int(np.asarray(consts[ins[3]]).reshape(-1)[0])] if len(ins) > 3 and ins[3] else [0]
        step = int(np.asarray(consts[ins[4]]).reshape(-1)[0]) if len(ins) > 4 and ins[4] else 1
        if axes[0] not in (0, -1) or step == 0:
            return None
        picked = np.asarray(dims[slice(starts, ends, step)], dtype=object)
    else:
        return None
    if not all(isinstance(d, int) for d in picked.reshape(-1)):
        return None
    return picked.astype(np.int64)


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


def _rename_outer(graph: onnx.GraphProto, ren: dict[str, str]) -> None:
    """Rename, inside a nested subgraph, the references to names of the enclosing branch (ONNX lets a
    subgraph read any outer value by name); names the subgraph defines itself shadow the outer ones."""
    own = ({i.name for i in graph.input} | {t.name for t in graph.initializer}
           | {o for n in graph.node for o in n.output if o})
    ren = {k: v for k, v in ren.items() if k not in own}
    for n in graph.node:
        for k, i in enumerate(n.input):
            n.input[k] = ren.get(i, i)
        for sg in _subgraphs(n):
            _rename_outer(sg, ren)
    for o in graph.output:
        o.name = ren.get(o.name, o.name)


def _inline_if(node: onnx.NodeProto, cond: bool) -> list[onnx.NodeProto]:
    """The nodes of the taken branch, renamed under the If's name.  Branches with nested If/Loop/Scan are
    inlined too (Silero VAD's top-level ``If(sr == 16000)`` holds three Ifs per branch): their references
    to the branch's values are renamed with it, and a later folding round inlines them in turn."""
    branch = next(a.g for a in node.attribute if a.name == ("then_branch" if cond else "else_branch"))
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
        for sg in _subgraphs(nn):
            _rename_outer(sg, ren)
        new_nodes.append(nn)
    for bo, out in zip(branch.output, node.output):
        if out:
            new_nodes.append(helper.make_node("Identity", [ren.get(bo.name, bo.name)], [out], name=f"{node.name}__out_{out}"))
    return new_nodes


def _fold_once(model: onnx.ModelProto, max_elements: int) -> bool:
    return _fold_graph(model.graph, {"": default_opset(model)}, max_elements, {}, {}, {}, {})


def _fold_graph(graph: onnx.GraphProto, opsets: dict[str, int], max_elements: int, consts: dict,
                shapes: dict, partial: dict, types: dict) -> bool:
    """One folding round over ``graph`` and, recursively, the branches of the If nodes it keeps: a branch
    sees the constants and shapes of its enclosing graphs (ONNX scoping), so a runtime ``If(sr == 16000)``
    still gets its branches' shape chains, squeeze tests and computed pads folded."""
    consts = {**consts, **{t.name: numpy_helper.to_array(t) for t in graph.initializer}}
    shapes = {**shapes, **_known_shapes(graph)}
    partial = {**partial, **_partial_shapes(graph)}
    shape_outputs: dict[str, list] = {}  # output of a Shape node on a partly symbolic value -> its dims
    types = {**types, **{
        vi.name: helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        for vi in list(graph.value_info) + list(graph.output)
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type
    }}
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
        if op == "Shape" and ins and ins[0] in partial:
            start = next((a.i for a in node.attribute if a.name == "start"), 0)
            end = next((a.i for a in node.attribute if a.name == "end"), None)
            shape_outputs[node.output[0]] = partial[ins[0]][start:end]
        if op in ("Gather", "Slice") and ins and ins[0] in shape_outputs:
            picked = _static_part(node, shape_outputs[ins[0]], consts)
            if picked is not None:
                add_const(node.output[0], picked)
                changed = True
                continue
        if op == "If" and ins and ins[0] in consts:
            new_nodes.extend(_inline_if(node, bool(np.asarray(consts[ins[0]]).reshape(-1)[0])))
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
        if op == "If":
            for branch in _subgraphs(node):
                changed |= _fold_graph(branch, opsets, max_elements, consts, shapes, partial, types)
        new_nodes.append(node)

    if not changed:
        return False
    del graph.node[:]
    graph.node.extend(new_nodes)
    graph.initializer.extend(new_inits)
    return True


def _eliminate_dead(graph: onnx.GraphProto) -> None:
    """Drop nodes no graph output needs, and unused initializers, here and in every subgraph."""
    for node in graph.node:
        for sg in _subgraphs(node):
            _eliminate_dead(sg)
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


def fold_constants(model: onnx.ModelProto, max_elements: int = MAX_FOLD_ELEMENTS, max_rounds: int = 16):
    """Shape inference + constant folding to a fixpoint; returns a new model."""
    model = _infer(model)
    for _ in range(max_rounds):
        if not _fold_once(model, max_elements):
            break
        _eliminate_dead(model.graph)
        model = _infer(model)
    _eliminate_dead(model.graph)
    return model
