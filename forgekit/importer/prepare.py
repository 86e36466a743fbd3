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
7. ``Scan`` nodes become ``Loop`` nodes, and ``Loop`` bodies are closed over their outer scope
   (:mod:`.loops`).

Only ``onnx`` and ``numpy`` are needed.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .errors import DynamicShapeError, PrepareError, fmt_shape
from .loops import close_loops, scans_to_loops
from .onnx_fold import MAX_FOLD_ELEMENTS, _infer, fold_constants
from .onnx_utils import (  # noqa: F401 - graph_inputs, value_shape: part of this module's interface
    _set_shape, _subgraphs, default_opset, graph_inputs, initializer_names, is_static, iter_nodes, value_shape)

MIN_OPSET = 11
DEFAULT_BATCH = 1


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


# --------------------------------------------------------------------------- API
def _bypass_identities(graph: onnx.GraphProto) -> None:
    """Drop the top graph's ``Identity`` nodes (not graph outputs), their consumers reading the input.

    TVM's frontend refuses a shape value as the input of any op outside a fixed list ("Node Identity.148
    cannot handle ShapeExpr inputs": paddle2onnx's Shape -> Identity -> Slice in PP-OCRv6 rec with a
    dynamic width); an Identity computes nothing anyway."""
    outputs = {o.name for o in graph.output}
    renames = {n.output[0]: n.input[0] for n in graph.node
               if n.op_type == "Identity" and n.output[0] not in outputs and n.input and n.input[0]}
    if not renames:
        return

    def source(name: str) -> str:
        while name in renames:
            name = renames[name]
        return name

    kept = [n for n in graph.node if not (n.op_type == "Identity" and n.output[0] in renames)]
    del graph.node[:]
    graph.node.extend(kept)
    for node in iter_nodes(graph):  # branch bodies read outer names too
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = source(name)


def _tile_repeats_as_tensors(graph: onnx.GraphProto) -> None:
    """Feed every ``Tile`` its repeats through ``Reshape(r, [1, -1]) -> Reshape([-1])`` (a 1-D tensor stays
    itself), in the graph and its branch and loop bodies.

    Repeats built from a shape (``Concat(Shape(h)[:1], [1], Shape(h)[2:])``: SLANet's decoder tiles its step
    indices to its history that way) reach TVM's frontend as a shape value, and it refuses one as the input of
    any op outside a fixed list, Tile among them ("Node p2o.Tile.0 cannot handle ShapeExpr inputs").  Reshape is
    on the list and makes a shape a tensor, which TVM's Tile takes at run time; constant repeats fold back."""
    nodes = []
    for node in graph.node:
        for sub in _subgraphs(node):
            _tile_repeats_as_tensors(sub)
        if node.op_type == "Tile" and len(node.input) > 1 and node.input[1]:
            base = f"{node.name or node.output[0]}_fk_repeats"
            nodes += [helper.make_node("Constant", [], [f"{base}_row"], value=numpy_helper.from_array(
                          np.array([1, -1], np.int64))),
                      helper.make_node("Constant", [], [f"{base}_flat"], value=numpy_helper.from_array(
                          np.array([-1], np.int64))),
                      helper.make_node("Reshape", [node.input[1], f"{base}_row"], [f"{base}_2d"]),
                      helper.make_node("Reshape", [f"{base}_2d", f"{base}_flat"], [base])]
            node.input[1] = base
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)


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
    _bypass_identities(model.graph)
    _tile_repeats_as_tensors(model.graph)
    if fold:
        model = fold_constants(model, max_fold_elements)
    else:
        model = _infer(model)
    scans_to_loops(model)
    close_loops(model)
    return model
