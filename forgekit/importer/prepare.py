"""Make an ONNX model importable by TVM's Relax ONNX frontend.

``prepare_onnx`` does, in order:

1. Old-style models: initializers that are also listed in ``graph.input`` are
   treated as constants (as TVM does) and dropped from the input list
   (``ir_version`` is raised to 4 where needed so the model stays valid).
2. Opset normalisation: a default-domain opset below ``min_opset`` (11) is
   converted with ``onnx.version_converter``; if that fails, the model is kept as
   it is (TVM has converters for most old versions) and a warning is issued.
3. Unnamed nodes get unique names (``<OpType>_<index>``) so that every later
   error can name the node.
4. Inputs the user freezes (``freeze={"sample_rate": 16000}``) become initializers.
5. Dynamic input dimensions are pinned:

   * ``shape_dict`` maps an input name to its full shape (``{"x": [1, 3, 320, 320]}``;
     a string dim stays symbolic under that name) or a ``dim_param`` symbol to a value
     (``{"batch": 1, "sequence": 128}``);
   * any remaining symbolic *leading* dimension of an input of rank >= 2 defaults
     to ``default_batch`` (1), since that is nearly always the batch;
   * any other dimension that is still dynamic raises :class:`DynamicShapeError`
     listing every dynamic input with its symbolic shape (unless
     ``allow_dynamic=True``, which leaves them symbolic for TVM).

6. Shape inference (``onnx.shape_inference`` with data propagation), then
   constant folding until nothing changes: ``Shape``/``Size`` of statically
   shaped tensors, every node whose inputs are all constant (evaluated with
   ``onnx.reference``; this folds the Shape/Gather/Concat/Reshape chains and
   turns a 0-d ``ConstantOfShape`` into a constant), ``If`` nodes whose condition
   is constant are replaced by the taken branch.  Dead nodes and unused
   initializers are removed.  Quantize/Dequantize and random ops are never folded.

Only ``onnx`` and ``numpy`` are needed.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from .errors import DynamicShapeError, PrepareError, fmt_shape

MIN_OPSET = 11
DEFAULT_BATCH = 1
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
_STD_DOMAINS = ("", "ai.onnx")


# --------------------------------------------------------------------------- helpers
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


# --------------------------------------------------------------------------- steps
def _drop_initializer_inputs(model: onnx.ModelProto) -> None:
    inits = initializer_names(model.graph)
    if not any(i.name in inits for i in model.graph.input):
        return
    keep = [i for i in model.graph.input if i.name not in inits]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    if model.ir_version < 4:
        model.ir_version = 4


def _normalise_opset(model: onnx.ModelProto, min_opset: int) -> onnx.ModelProto:
    cur = default_opset(model)
    if cur >= min_opset:
        return model
    try:
        from onnx import version_converter

        return version_converter.convert_version(model, min_opset)
    except Exception as exc:  # noqa: BLE001 - keep the model as it is
        warnings.warn(
            f"opset {cur} -> {min_opset} conversion failed ({str(exc).splitlines()[0][:120]}); "
            "importing with the original opset",
            stacklevel=3,
        )
        return model


def iter_named_nodes(graph: onnx.GraphProto, used: set[str] | None = None):
    """``(node, name)`` for every node (subgraphs included) without modifying the model.

    Unnamed nodes get the name :func:`prepare_onnx` gives them (``<OpType>_<index>``, made unique),
    so a pre-flight check and an import error name the same node the same way.
    """
    used = used if used is not None else set()
    for n in graph.node:
        if n.name:
            used.add(n.name)
    for i, n in enumerate(graph.node):
        name = n.name
        if not name:
            base = f"{n.op_type}_{i}"
            name, k = base, 1
            while name in used:
                name, k = f"{base}_{k}", k + 1
            used.add(name)
        yield n, name
        for g in _subgraphs(n):
            yield from iter_named_nodes(g, used)


def _name_nodes(graph: onnx.GraphProto) -> None:
    for node, name in list(iter_named_nodes(graph)):
        if not node.name:
            node.name = name


def _freeze_inputs(model: onnx.ModelProto, freeze: Mapping[str, object]) -> None:
    by_name = {i.name: i for i in model.graph.input}
    for name, value in freeze.items():
        if name not in by_name:
            raise PrepareError(
                f"freeze: '{name}' is not a graph input: use one of {', '.join(sorted(by_name))}"
            )
        vi = by_name[name]
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        arr = np.asarray(value, dtype=dtype)
        shp = value_shape(vi)
        if shp is not None and len(shp) != arr.ndim:
            if arr.size == 1 and shp is not None:
                arr = arr.reshape([1] * len(shp))
            else:
                raise PrepareError(f"freeze: '{name}' has rank {len(shp)} but the value has shape {arr.shape}: "
                                  "give a value of the input's shape")
        model.graph.initializer.append(numpy_helper.from_array(arr, name))
    keep = [i for i in model.graph.input if i.name not in freeze]
    del model.graph.input[:]
    model.graph.input.extend(keep)


def _pin_inputs(model, shape_dict, default_batch, allow_dynamic, allow_static_override=False) -> None:
    """Apply ``shape_dict`` / ``default_batch`` to the graph inputs (see :func:`prepare_onnx`).

    A dimension given as a string (``{"x": ["N", 3, 224, 224]}``) stays symbolic under that name.
    """
    shape_dict = dict(shape_dict or {})
    inputs = {vi.name: vi for vi in graph_inputs(model)}
    symbol_values = {k: v for k, v in shape_dict.items() if k not in inputs}
    for k, v in symbol_values.items():
        if not isinstance(v, (int, np.integer)):
            raise PrepareError(
                f"shape_dict key '{k}' is neither a graph input ({', '.join(sorted(inputs))}) "
                "nor a dimension symbol given an int value: fix shape_dict"
            )
    still_dynamic = []
    for name, vi in inputs.items():
        if not vi.type.HasField("tensor_type"):
            raise PrepareError(f"Input '{name}' is not a tensor (sequence/map inputs are not supported): "
                               "re-export the model with tensor inputs")
        shp = value_shape(vi)
        if name in shape_dict:
            want = [d if isinstance(d, str) and not d.isdigit() else int(d) for d in shape_dict[name]]
            if shp is not None:
                if len(shp) != len(want):
                    raise PrepareError(f"shape_dict['{name}'] has rank {len(want)} but the model input has shape "
                                       f"{fmt_shape(shp)}: give {len(shp)} dimensions")
                for i, (have, w) in enumerate(zip(shp, want)):
                    if isinstance(have, int) and have != w and not (allow_static_override and isinstance(w, int)):
                        raise PrepareError(
                            f"shape_dict['{name}'] dim {i} = {w} contradicts the model's static size {have}: "
                            f"use {have} there"
                        )
            if any(isinstance(d, int) and d <= 0 for d in want):
                raise PrepareError(f"shape_dict['{name}'] = {want} has a dimension <= 0: use positive sizes")
            _set_dims(vi, want)
            if not is_static(want):
                still_dynamic.append((name, want))
            continue
        if shp is None:
            still_dynamic.append((name, None))
            continue
        new = []
        for i, d in enumerate(shp):
            if isinstance(d, int):
                new.append(d)
            elif d in symbol_values:
                new.append(int(symbol_values[d]))
            elif i == 0 and len(shp) >= 2 and default_batch is not None:
                new.append(int(default_batch))
            else:
                new.append(d)
        if is_static(new):
            _set_shape(vi, new)
        else:
            # keep the symbols the user did pin
            tt = vi.type.tensor_type
            for dim, d in zip(tt.shape.dim, new):
                if isinstance(d, int):
                    dim.Clear()
                    dim.dim_value = d
            still_dynamic.append((name, new))
    if still_dynamic and not allow_dynamic:
        first, shape = still_dynamic[0]
        example = "x".join(str(d if isinstance(d, int) else 1) for d in (shape or [1]))
        hint = (f"pin them with shape_dict={{input: [dims...]}} or {{symbol: value}} "
                f"(CLI: --input-shape {first}={example})")
        if default_batch is not None:
            hint += f"; a symbolic leading dim of a rank>=2 input defaults to {default_batch}"
        raise DynamicShapeError(still_dynamic, hint)


def _set_dims(vi: onnx.ValueInfoProto, dims: Sequence[int | str]) -> None:
    """Set a value's shape; string dims become ``dim_param`` symbols."""
    tt = vi.type.tensor_type
    tt.ClearField("shape")
    tt.shape.SetInParent()
    for d in dims:
        if isinstance(d, str):
            tt.shape.dim.add().dim_param = d
        else:
            tt.shape.dim.add().dim_value = int(d)


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


# --------------------------------------------------------------------------- API
def prepare_onnx(
    model: onnx.ModelProto,
    shape_dict: Mapping[str, Sequence[int] | int] | None = None,
    *,
    freeze: Mapping[str, object] | None = None,
    default_batch: int | None = DEFAULT_BATCH,
    allow_dynamic: bool = False,
    allow_static_override: bool = False,
    fold: bool = True,
    min_opset: int = MIN_OPSET,
    max_fold_elements: int = MAX_FOLD_ELEMENTS,
) -> onnx.ModelProto:
    """Return a copy of ``model`` ready for ``tvm.relax.frontend.onnx.from_onnx``.

    See the module docstring for the steps.  A string dimension in a
    ``shape_dict`` entry stays symbolic under that name.  Raises
    :class:`DynamicShapeError` when input dimensions stay dynamic (unless
    ``allow_dynamic``) and :class:`PrepareError` for bad arguments; with
    ``allow_static_override`` a ``shape_dict`` entry may replace a static
    dimension (what ``IRModule.set_batch_size`` needs) instead of raising.
    ``default_batch=None`` leaves symbolic leading dimensions alone.
    The input model is not modified.
    """
    if not isinstance(model, onnx.ModelProto):
        raise PrepareError(f"Expected an onnx.ModelProto, got {type(model).__name__}: load the model with onnx.load")
    model = copy.deepcopy(model)
    _drop_initializer_inputs(model)
    model = _normalise_opset(model, min_opset)
    _name_nodes(model.graph)
    if freeze:
        _freeze_inputs(model, freeze)
    _pin_inputs(model, shape_dict, default_batch, allow_dynamic, allow_static_override)
    if fold:
        model = fold_constants(model, max_fold_elements)
    else:
        model = _infer(model)
    return model
