"""PyTorch peers of the benchmark's ONNX models that ``torch.compile`` accepts (used by ``bench/gpu_run.py``).

onnx2torch converts shape-taking ONNX ops (Reshape, Expand, Tile, Resize, Unsqueeze/Squeeze with axes as an
input, ...) into modules that read the shape from a *tensor* at run time: ``torch.Size(shape_tensor)``,
``torch.any(shape == 0)``, ``scales.tolist()``.  Eager PyTorch runs that, but dynamo sees fake tensors there:
``torch.Size()`` fails outright ("takes an iterable of 'int' (item 0 is 'FakeTensor')", bert_style's Reshapes)
and ``.tolist()`` / ``if tensor`` break the graph (PP-OCR's Resizes: a compile split into many graphs).

The benchmark's models have static input shapes, so every such shape is known before the first call.
:func:`torch_module` runs the converted ``torch.fx.GraphModule`` once on zero inputs of those shapes, then
rewrites the graph: shape-taking ops become plain torch calls with Python-int shapes, and whatever depends only
on weights and shapes (Shape->Gather->Concat chains, ConstantOfShape, Range) is folded into a buffer.  The
result is still device- and dtype-agnostic (``.cuda()`` and ``.half()`` work on it as on onnx2torch's module).
Two more rewrites work around inductor's attention fusion, which failed on bert_style (see ``_rewrite``).
"""

from __future__ import annotations

#: onnx2torch modules whose output shape fixes what they do: replaced by ``torch.reshape(x, output_shape)``
RESHAPES = {"OnnxReshape", "OnnxUnsqueezeDynamicAxes", "OnnxSqueezeDynamicAxes"}
#: onnx2torch modules whose output depends only on the *shape* of their input, never on its values
SHAPE_ONLY = {"OnnxShape"}


def torch_module(torch, onnx2torch_convert, proto, device: str = "cpu"):
    """``proto`` (an ``onnx.ModelProto`` with static input shapes, left unchanged) as a ``torch.nn.Module``
    on ``device`` in fp32, with onnx2torch's run-time shape reading replaced by constants (see the module
    doc).  Finding the shapes takes one call of the model on ``device``: "cuda" makes that cheap at batch 32."""
    import onnx
    from onnx import numpy_helper

    model = onnx.ModelProto()
    model.CopyFrom(proto)
    # onnx2torch reads weights from initializers only: Paddle exports (PP-OCR) hold them in Constant nodes.
    # As initializers they also let onnx2torch pick its static-axes modules (Unsqueeze/Squeeze opset 13).
    for node in [n for n in model.graph.node if n.op_type == "Constant" and n.attribute[0].name == "value"]:
        model.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(node.attribute[0].t),
                                                               node.output[0]))
        model.graph.node.remove(node)
    gm = onnx2torch_convert(model).eval().to(device)
    inputs = _zero_inputs(torch, model, device)
    static = _static_nodes(gm)
    shapes, values = _record(torch, gm, inputs, static)
    _rewrite(torch, gm, static, shapes, values)
    return gm


def _zero_inputs(torch, model, device: str) -> list:
    """Zeros shaped and typed like the model's inputs (in onnx2torch's placeholder order)."""
    from onnx import helper

    weights = {i.name for i in model.graph.initializer}
    inputs = []
    for value in model.graph.input:
        if value.name in weights:
            continue
        kind = value.type.tensor_type
        dims = [d.dim_value for d in kind.shape.dim]
        if any(d <= 0 for d in dims):  # a symbolic dimension: nothing static to specialize on
            raise ValueError(f"input {value.name!r} has no static shape: {dims}")
        dtype = helper.tensor_dtype_to_np_dtype(kind.elem_type)
        inputs.append(torch.zeros(dims, dtype=getattr(torch, dtype.name), device=device))  # float32, int64...
    return inputs


def _static_nodes(gm) -> set:
    """The nodes whose value is the same for every input of the static shapes: weights (get_attr), shapes of
    tensors (OnnxShape) and whatever is computed from those alone."""
    static = set()
    for node in gm.graph.nodes:
        sources = node.all_input_nodes
        if node.op == "get_attr":
            static.add(node)
        elif node.op == "call_module" and type(gm.get_submodule(node.target)).__name__ in SHAPE_ONLY:
            static.add(node)
        elif node.op in ("call_module", "call_function", "call_method") and all(s in static for s in sources):
            static.add(node)
    return static


def _record(torch, gm, inputs: list, static: set) -> tuple[dict, dict]:
    """One run on ``inputs``: every tensor node's output shape, and the value of every static node (small:
    shapes, axes, scales; big weight-only ones are kept too, they become buffers like the weights are)."""
    shapes, values = {}, {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node):
            result = super().run_node(node)
            if isinstance(result, torch.Tensor):
                shapes[node] = tuple(result.shape)
            if node in static:
                values[node] = result
            return result

    with torch.inference_mode():
        Recorder(gm).run(*inputs)
    return shapes, values


def _rewrite(torch, gm, static: set, shapes: dict, values: dict) -> None:
    """Shape-taking modules to torch calls with Python shapes; static values still used at run time to
    buffers; then the graph without the nodes, modules and buffers nothing uses any more."""
    from onnx2torch.node_converters.resize import _onnx_mode_to_torch_mode

    graph = gm.graph
    for node in list(graph.nodes):
        if node in static or node.op != "call_module" or node not in shapes:
            continue
        module = gm.get_submodule(node.target)
        kind, x = type(module).__name__, node.args[0] if node.args else None
        const = [a for a in node.args[1:] if isinstance(a, torch.fx.Node) and a in static]
        perm = getattr(module, "perm", None) if kind == "OnnxTranspose" else None
        if not const and not (perm and len(perm) > 2 and perm[-1] < perm[-2]):
            continue  # no shape read from a tensor, no transpose to split: nothing for dynamo to trip on
        with graph.inserting_before(node):
            if perm:  # K^T as one permute (0, 2, 3, 1): inductor's attention fusion takes any permute before
                # Q @ K^T for K.transpose(-2, -1) (pattern _sfdp_*: permute(key, Ignored())) and builds SDPA on
                # the wrong key (fails: "Attempting to broadcast a dimension").  As permute(0, 2, 1, 3) and
                # transpose(-2, -1), the key it finds is the right one.
                first = graph.call_method("permute", (x, (*perm[:-2], perm[-1], perm[-2])))
                new = graph.call_method("transpose", (first, -2, -1))
            elif kind in RESHAPES:  # torch.Size(shape) / sorted axes tensor: the output shape says it all
                new = graph.call_function(torch.reshape, (x, shapes[node]))
            elif kind == "OnnxExpand":  # x * ones(torch.Size(shape)): a broadcast to the output shape
                new = graph.call_function(torch.broadcast_to, (x, shapes[node]))
            elif kind == "OnnxTile":  # x.repeat(torch.Size(repeats)): repeats = output / input per dim
                new = graph.call_method("repeat", (x, tuple(o // max(i, 1) for o, i in zip(shapes[node],
                                                                                          shapes[x]))))
            elif kind == "OnnxBinaryMathOperation" and _scalar(torch, node, values) and module.broadcast != 1:
                # x / tensor(8.0) (attention's 1/sqrt(d)): inductor's attention fusion passes the divisor to
                # scaled_dot_product_attention(scale=...) which needs a float, not a 0-d tensor (it fails)
                op = {"_onnx_div": torch.div}.get(module.math_op_function.__name__, module.math_op_function)
                new = graph.call_function(op, (x, float(values[node.args[1]])))
            elif kind in ("OnnxResize", "OnnxResizeV10"):  # scales.tolist() / sizes.tolist(): graph breaks
                new = _interpolate(torch, graph, node, module, x, shapes, values, _onnx_mode_to_torch_mode)
            else:  # an op not listed here keeps its tensor argument (folded below): eager-correct, and at worst
                continue  # a graph break under torch.compile
        node.replace_all_uses_with(new)
        graph.erase_node(node)
    for node in list(graph.nodes):  # what is left of the static part, as buffers (Shape->Gather->Concat...)
        if node.op == "get_attr" or node not in values or all(u in static for u in node.users):
            continue
        name = f"_folded_{len(values)}_{node.name}"
        gm.register_buffer(name, values[node].detach().clone())
        with graph.inserting_before(node):
            node.replace_all_uses_with(graph.get_attr(name))
    graph.eliminate_dead_code()
    gm.delete_all_unused_submodules()
    used = {n.target for n in graph.nodes if n.op == "get_attr"}
    for name, _ in list(gm.named_buffers()):  # weights nothing reads any more (shape constants, scales), not
        owner, _, attr = name.rpartition(".")  # a called module's own (BatchNorm's running_mean)
        if name not in used and (owner == "" or type(gm.get_submodule(owner)).__name__ == "InitializersContainer"):
            delattr(gm.get_submodule(owner), attr)
    gm.recompile()


def _scalar(torch, node, values: dict) -> bool:
    """Whether ``node``'s second operand is a static 0-d float tensor (its first a run-time tensor)."""
    value = values.get(node.args[1]) if len(node.args) == 2 else None
    return isinstance(value, torch.Tensor) and value.dim() == 0 and value.is_floating_point() \
        and node.args[0] not in values


def _interpolate(torch, graph, node, module, x, shapes: dict, values: dict, torch_mode):
    """Resize as ``F.interpolate`` with Python scales (as onnx2torch passes them after ``tolist()``) or, where
    the model gives sizes, the output size."""
    resize = getattr(module, "_resize", module)  # OnnxResizeV10 wraps an OnnxResize
    names = ["scales"] if type(module).__name__ == "OnnxResizeV10" else ["roi", "scales", "sizes"]
    given = dict(zip(names, node.args[1:]), **node.kwargs)
    scales = given.get("scales")
    scales = values.get(scales) if scales is not None else None
    kwargs = {"mode": torch_mode(resize.onnx_mode, len(shapes[x]) - 2), "align_corners": resize.align_corners}
    if scales is not None and scales.numel():
        kwargs["scale_factor"] = tuple(float(s) for s in scales.tolist()[2:])
    else:
        kwargs["size"] = shapes[node][2:]
    return graph.call_function(torch.nn.functional.interpolate, (x,), kwargs)
