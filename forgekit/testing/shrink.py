"""Delta-debugging of a failing ONNX model down to a minimal one that still fails the same way.

:func:`shrink` repeats three reductions until none applies (each candidate must pass
``onnx.checker`` with ``full_check``, run in onnxruntime on its feeds, and make ``still_fails`` true):

* **prefix cut** — keep only what computes one value and make it the single graph output;
* **input cut** — make a value a graph input and drop everything only needed to compute it; the new
  input's observed shapes (per feed set) and value range are recorded in the model's metadata
  (:data:`forgekit.testing.graph.INPUT_META`) so :func:`~forgekit.testing.graph.feeds_for` can
  feed it like the original computation did (positive where a Log expected positive values, ...);
* **bypass** — remove one node, rewiring its consumers to an earlier value of the same dtype and
  shapes (usually the node's own input).
"""

from __future__ import annotations

import copy
import json
from typing import Any, Callable

import numpy as np
import onnx
from onnx import helper

from .graph import ENVS, INPUT_META, SYMBOLS, _input_meta, dim_add, feeds_for

Observed = dict[str, tuple[int, list[tuple[int, ...]], float, float]]  # name -> (elem type, shapes, lo, hi)


def _run(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    from .differential import reference

    return reference(model, feeds)


def observe(model: onnx.ModelProto) -> Observed:
    """Dtype, per-feed shapes and value range of every value, from onnxruntime on ``feeds_for(model)``."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {vi.name: vi.type.tensor_type.elem_type
             for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    m = copy.deepcopy(model)
    have = {o.name for o in m.graph.output}
    names = [o.name for o in m.graph.output]
    for node in m.graph.node:
        for out in node.output:
            if out and out not in have and out in types:
                m.graph.output.append(helper.make_tensor_value_info(out, types[out], None))
                names.append(out)
                have.add(out)
    feeds = feeds_for(model)
    runs = _run(m, feeds)
    inputs = list(feeds[0])
    names += inputs
    runs = [outs + [feed[n] for n in inputs] for outs, feed in zip(runs, feeds)]
    result: Observed = {}
    for i, name in enumerate(names):
        arrays = [r[i] for r in runs]
        elem = helper.np_dtype_to_tensor_dtype(arrays[0].dtype)
        flat = [a.astype(np.float64).ravel() for a in arrays if a.size]
        both = np.concatenate(flat) if flat else np.zeros(1)
        both = both[np.isfinite(both)] if np.isfinite(both).any() else np.zeros(1)
        result[name] = (elem, [tuple(a.shape) for a in arrays], float(both.min()), float(both.max()))
    return result


def _declared(shapes: list[tuple[int, ...]]) -> list[int | str]:
    """Static dims where all feeds agree, else the symbol (``N``, ``W``, ``Wm2``...) that explains them."""
    dims: list[int | str] = []
    for axis in range(len(shapes[0])):
        vals = [s[axis] for s in shapes]
        if len(set(vals)) == 1:
            dims.append(vals[0])
            continue
        name = f"d{axis}"
        for sym in SYMBOLS:
            offs = {v - ENVS[k % len(ENVS)][sym] for k, v in enumerate(vals)}
            if len(offs) == 1:
                name = str(dim_add(sym, offs.pop())).replace("-", "m").replace("+", "p")
                break
        dims.append(name)
    return dims


def _rebuild(model: onnx.ModelProto, nodes: list[onnx.NodeProto], outputs: list[onnx.ValueInfoProto],
             new_inputs: list[onnx.ValueInfoProto] = (), meta: dict[str, Any] | None = None) -> onnx.ModelProto:
    """A model with ``nodes`` (dead ones removed), ``outputs``, and unused inputs/initializers dropped."""
    needed = {o.name for o in outputs}
    kept: list[onnx.NodeProto] = []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(i for i in node.input if i)
    kept.reverse()
    inputs = [vi for vi in [*model.graph.input, *new_inputs] if vi.name in needed]
    inits = [t for t in model.graph.initializer if t.name in needed]
    graph = helper.make_graph(kept, model.graph.name, inputs, outputs, initializer=inits)
    out = helper.make_model(graph, opset_imports=list(model.opset_import), producer_name=model.producer_name)
    out.ir_version = model.ir_version
    meta = dict(meta if meta is not None else _input_meta(model))
    meta = {k: v for k, v in meta.items() if k in {vi.name for vi in inputs}}
    for prop in model.metadata_props:
        if prop.key != INPUT_META:
            out.metadata_props.add(key=prop.key, value=prop.value)
    if meta:
        out.metadata_props.add(key=INPUT_META, value=json.dumps(meta, sort_keys=True))
    return out


def _vi(name: str, obs: Observed) -> onnx.ValueInfoProto:
    elem, shapes, _, _ = obs[name]
    return helper.make_tensor_value_info(name, elem, _declared(shapes))


def prefix_cut(model: onnx.ModelProto, value: str, obs: Observed) -> onnx.ModelProto:
    return _rebuild(model, list(model.graph.node), [_vi(value, obs)])


def input_cut(model: onnx.ModelProto, value: str, obs: Observed) -> onnx.ModelProto:
    nodes = [n for n in model.graph.node if value not in n.output]
    elem, shapes, lo, hi = obs[value]
    meta = _input_meta(model)
    meta[value] = {"lo": lo, "hi": hi, "shapes": [list(s) for s in shapes]}
    outputs = [o for o in model.graph.output if o.name != value]
    return _rebuild(model, nodes, outputs, [_vi(value, obs)], meta)


def bypass(model: onnx.ModelProto, index: int, obs: Observed) -> onnx.ModelProto | None:
    """Remove node ``index``, rewiring each of its outputs to an earlier value with equal dtype/shapes."""
    nodes = list(model.graph.node)
    node = nodes[index]
    earlier = [*[i for i in node.input if i], *[vi.name for vi in model.graph.input],
               *[o for n in nodes[:index] for o in n.output if o]]
    rename: dict[str, str] = {}
    for out in node.output:
        if not out or out not in obs:
            continue
        match = next((e for e in earlier if e in obs and obs[e][:2] == obs[out][:2]), None)
        if match is None:
            return None
        rename[out] = match
    outputs = [o for o in model.graph.output if o.name not in rename]
    if not outputs:
        return None
    new_nodes = []
    for n in nodes[index + 1:]:
        n2 = copy.deepcopy(n)
        for k, name in enumerate(n2.input):
            if name in rename:
                n2.input[k] = rename[name]
        new_nodes.append(n2)
    return _rebuild(model, nodes[:index] + new_nodes, outputs)


def _valid(model: onnx.ModelProto) -> bool:
    try:
        onnx.checker.check_model(model, full_check=True)
        if not model.graph.node:
            return False
        _run(model, feeds_for(model))
        return True
    except Exception:
        return False


def shrink(model: onnx.ModelProto, still_fails: Callable[[onnx.ModelProto], bool], *, max_checks: int = 300,
           log: Callable[[str], None] | None = None) -> onnx.ModelProto:
    """The smallest model (in nodes) found that is valid and for which ``still_fails`` holds.

    ``still_fails`` should test for the *same* failure class as the original (see
    :func:`forgekit.testing.differential.check`); it is called at most ``max_checks`` times.
    """
    checks = 0
    best = model

    def attempt(candidate: onnx.ModelProto | None) -> bool:
        nonlocal checks, best
        if candidate is None or len(candidate.graph.node) >= len(best.graph.node) or checks >= max_checks:
            return False
        if not _valid(candidate):
            return False
        checks += 1
        if still_fails(candidate):
            best = candidate
            if log:
                log(f"shrink: {len(best.graph.node)} nodes ({checks} checks)")
            return True
        return False

    progress = True
    while progress and checks < max_checks:
        progress = False
        try:
            obs = observe(best)
        except Exception as exc:  # onnxruntime cannot expose the values: stop here
            if log:
                log(f"shrink: cannot observe values ({type(exc).__name__}: {exc})")
            break
        values = [o for n in best.graph.node for o in n.output if o in obs]
        for value in values:  # earliest first: the biggest cuts
            if attempt(prefix_cut(best, value, obs)):
                progress = True
                break
        if progress:
            continue
        for value in reversed(values):
            if attempt(input_cut(best, value, obs)):
                progress = True
                break
        if progress:
            continue
        for index in range(len(best.graph.node)):
            if attempt(bypass(best, index, obs)):
                progress = True
                break
    return best
