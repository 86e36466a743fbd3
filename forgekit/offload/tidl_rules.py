"""Which ONNX nodes TI's TIDL runs on the C7x/MMA, and why not the others: one check per operator.

Written in our own words from TI's operator table, edgeai-tidl-tools ``docs/supported_ops_rts_versions.md``
(rel 10/11: "Operator Mapping (ONNX)", "Support for fused combinations", "Feature set comparison across
devices"); TI's tools are the authority, this is the plan forgekit shows before (or without) running them.
A check returns ``None`` when TIDL takes the node, else the reason in a few words.  Per-device differences
come from :attr:`forgekit.targets.ti.TiBoard.lacks`.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .tidl_graph import OnnxGraph

Check = Callable[[Any, OnnxGraph, frozenset], "str | None"]


def _non_singleton(shape: tuple[int, ...] | None) -> int:
    return sum(1 for d in shape or () if d != 1)


def _dims_at_most(limit: int) -> Check:
    def check(node: Any, g: OnnxGraph, lacks: frozenset) -> str | None:
        for name in g.variable_inputs(node):
            shape = g.shape(name)
            if shape is None:
                return f"shape of input '{name}' unknown (run shape inference or pin the input shape)"
            if _non_singleton(shape) > limit:
                return f"input has {_non_singleton(shape)} non-singleton dims (TIDL: at most {limit})"
        return None
    return check


def _all(*checks: Check) -> Check:
    def check(node: Any, g: OnnxGraph, lacks: frozenset) -> str | None:
        for c in checks:
            reason = c(node, g, lacks)
            if reason:
                return reason
        return None
    return check


def _one_variable_input(node: Any, g: OnnxGraph, lacks: frozenset) -> str | None:
    return None if len(g.variable_inputs(node)) <= 1 else "weights computed at run time (TIDL: one variable input)"


def _conv(node: Any, g: OnnxGraph, lacks: frozenset) -> str | None:
    w = g.shape(node.input[1]) if len(node.input) > 1 else None
    if w is None or len(w) != 4:
        return "only 2-D convolutions with known weights"
    kh, kw = w[2], w[3]
    strides = list(g.attr(node, "strides", [1, 1]))
    dilations = list(g.attr(node, "dilations", [1, 1]))
    group = int(g.attr(node, "group", 1))
    x = g.shape(node.input[0])
    if strides[0] != strides[1]:
        return f"strides {strides[0]}x{strides[1]} differ (TIDL: equal strides)"
    s = strides[0]
    if any(d != 1 for d in dilations) and s != 1:
        return "dilated convolution with a stride (TIDL: dilation only without stride)"
    if s == 4 and (kh, kw) != (11, 11):
        return f"stride 4 with a {kh}x{kw} kernel (TIDL: stride 4 only with 11x11)"
    if s == 2 and max(kh, kw) > 7:
        return f"{kh}x{kw} kernel with stride 2 (TIDL: at most 7x7 at stride 2)"
    if s == 3 and (kh, kw) == (3, 3) and "conv_3x3_stride3" in lacks:
        return "3x3 kernel with stride 3 is not supported on this device"
    depthwise = x is not None and group > 1 and group == x[1] and w[1] == 1
    # TI's rel-10 table lists "1x1s2, 3x3s1, 3x3s2, 5x5s2, 5x5s2, 7x7s1 & 7x7s2"; the repeated 5x5s2 reads
    # as 5x5s1 + 5x5s2, which the older table ("3x3, 5x5, 7x7 with stride 1") and TI's model zoo (PP-OCRv4
    # det, 5x5 s1 depthwise, runs offloaded) agree with
    if depthwise and (kh, kw, s) not in {(1, 1, 2), (3, 3, 1), (3, 3, 2), (5, 5, 1), (5, 5, 2), (7, 7, 1), (7, 7, 2)}:
        return f"depthwise {kh}x{kw} stride {s} (TIDL: 1x1s2, 3x3s1/s2, 5x5s1/s2, 7x7s1/s2)"
    pads = list(g.attr(node, "pads", [0, 0, 0, 0]))
    if x is not None and len(pads) == 4 and x[3] < max(pads[1], pads[3]):
        return "input narrower than its left/right padding"
    return None


def _conv_transpose(node: Any, g: OnnxGraph, lacks: frozenset) -> str | None:
    w = g.shape(node.input[1]) if len(node.input) > 1 else None
    strides = list(g.attr(node, "strides", [1, 1]))
    if w is None or len(w) != 4 or (w[2], w[3]) not in {(2, 2), (3, 3), (4, 4)} or strides != [2, 2]:
        kernel = f"{w[2]}x{w[3]}" if w is not None and len(w) == 4 else "unknown"
        return f"{kernel} kernel, strides {strides} (TIDL: 2x2, 3x3 or 4x4 kernels at stride 2)"
    return None


def _pool(node: Any, g: OnnxGraph, lacks: frozenset) -> str | None:
    k = tuple(g.attr(node, "kernel_shape", []))
    s = tuple(g.attr(node, "strides", [1] * len(k)))
    if k not in {(1, 1), (2, 2), (3, 3)} or len(set(s)) != 1 or s[0] not in (1, 2):
        return f"kernel {'x'.join(map(str, k))} stride {'x'.join(map(str, s))} (TIDL: 1x1, 2x2, 3x3 at stride 1 or 2)"
    return None


def _eltwise(node: Any, g: OnnxGraph, lacks: frozenset) -> str | None:
    if len(node.input) != 2:
        return "more than two inputs (TIDL: two)"
    variables = g.variable_inputs(node)
    if node.op_type in ("Sub", "Div"):
        if len(variables) == 2:
            return f"{node.op_type} of two run-time tensors (TIDL: one operand constant)"
        const = [i for i in node.input if i in g.constants]
        shape = g.shape(const[0]) if const else None
        if shape is not None and _non_singleton(shape) > 1:
            return f"constant operand of shape {list(shape)} (TIDL: a number or a 1-D vector)"
    return None


def _concat(node: Any, g: OnnxGraph, lacks: frozenset) -> str | None:
    out = g.shape(node.output[0])
    axis = int(g.attr(node, "axis", 0))
    rank = len(out) if out else 4
    if axis % rank < rank - 3 or axis % rank == 0:
        return f"axis {axis} of a rank-{rank} tensor (TIDL: one of the last three axes, never batch)"
    return None


def _softmax(node: Any, g: OnnxGraph, lacks: frozenset) -> str | None:
    out = g.shape(node.output[0])
    axis = int(g.attr(node, "axis", -1))
    rank = len(out) if out else 4
    return None if axis % rank == rank - 1 else f"softmax over axis {axis} (TIDL: the last (width) axis)"


def _matmul(node: Any, g: OnnxGraph, lacks: frozenset) -> str | None:
    if node.op_type == "Gemm":
        if g.attr(node, "transA", 0) or g.attr(node, "alpha", 1.0) != 1.0 or g.attr(node, "beta", 1.0) != 1.0:
            return "Gemm with transA or alpha/beta != 1 (TIDL: a plain fully connected layer)"
    b = g.shape(node.input[1])
    if b is not None and len(b) < 2:
        return "a 1-D second operand (TIDL: at least 2-D)"
    return None


def _reshape(node: Any, g: OnnxGraph, lacks: frozenset) -> str | None:
    if len(node.input) > 1 and node.input[1] not in g.constants:
        return "shape computed at run time (TIDL: a constant shape)"
    return "allowzero=1" if g.attr(node, "allowzero", 0) else None


def _transpose(node: Any, g: OnnxGraph, lacks: frozenset) -> str | None:
    perm = list(g.attr(node, "perm", []))
    return "moves the batch axis" if perm and perm[0] != 0 else None


def _slice(node: Any, g: OnnxGraph, lacks: frozenset) -> str | None:
    x = g.shape(node.input[0])
    if x is not None and x and x[0] != 1:
        return f"batch {x[0]} (TIDL: slices of batch 1)"
    if node.op_type == "Slice":
        if any(i not in g.constants for i in node.input[1:] if i):
            return "bounds computed at run time (TIDL: constant starts/ends/axes)"
        steps = g.const_values.get(node.input[4]) if len(node.input) > 4 and node.input[4] else None
        if steps is not None and np.any(np.asarray(steps) != 1):
            return "a step other than 1"
    return None


def _resize(node: Any, g: OnnxGraph, lacks: frozenset) -> str | None:
    mode = g.attr(node, "mode", b"nearest")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in ("nearest", "linear"):
        return f"mode {mode} (TIDL: nearest or linear)"
    x, out = g.shape(node.input[0]), g.shape(node.output[0])
    if x and out and len(x) == 4:
        fh, fw = out[2] / x[2], out[3] / x[3]
        if fh != fw or fh < 1 or not float(fh).is_integer() or int(fh) & (int(fh) - 1):
            return f"scale {fh:g}x{fw:g} (TIDL: equal power-of-two upscales)"
    return None


def _depth_to_space(node: Any, g: OnnxGraph, lacks: frozenset) -> str | None:
    if "depth_to_space" in lacks:
        return "DepthToSpace is not supported on this device"
    return None if int(g.attr(node, "blocksize", 0)) in (2, 4, 8) else "blocksize other than 2, 4 or 8"


def _clip(node: Any, g: OnnxGraph, lacks: frozenset) -> str | None:
    lo = g.const_values.get(node.input[1]) if len(node.input) > 1 and node.input[1] else g.attr(node, "min")
    hi = g.const_values.get(node.input[2]) if len(node.input) > 2 and node.input[2] else g.attr(node, "max")
    if lo is None or hi is None or not (float(np.asarray(lo)) <= 0 < float(np.asarray(hi))):
        return "bounds not min <= 0 < max"
    return None


def _reduce_height(node: Any, g: OnnxGraph, lacks: frozenset) -> str | None:
    axes = g.attr(node, "axes") or (list(g.const_values.get(node.input[1], [])) if len(node.input) > 1 else [])
    rank = len(g.shape(node.input[0]) or (0, 0, 0, 0))
    if [int(a) % rank for a in axes] != [rank - 2] or not g.attr(node, "keepdims", 1):
        return "reduction not over height with keepdims (TIDL: height only)"
    return None


def _argmax(node: Any, g: OnnxGraph, lacks: frozenset) -> str | None:
    rank = len(g.shape(node.input[0]) or (0, 0, 0, 0))
    if int(g.attr(node, "axis", 0)) % rank != rank - 3 or not g.attr(node, "keepdims", 1):
        return "ArgMax not over channels with keepdims (TIDL: axis -3)"
    return None


def _pad(node: Any, g: OnnxGraph, lacks: frozenset) -> str | None:
    mode = g.attr(node, "mode", b"constant")
    return None if (mode.decode() if isinstance(mode, bytes) else mode) == "constant" else "only constant padding"


def _cast(node: Any, g: OnnxGraph, lacks: frozenset) -> str | None:
    at_edge = any(i in g.inputs for i in node.input) or any(o in g.outputs for o in node.output)
    return None if at_edge else "Cast inside the network (TIDL: only at inputs and outputs)"


def _fused_only(pattern: str, ok: Callable[[Any, OnnxGraph], bool]) -> Check:
    def check(node: Any, g: OnnxGraph, lacks: frozenset) -> str | None:
        return None if ok(node, g) else f"{node.op_type} alone (TIDL: only inside a fused {pattern})"
    return check


def _in_layernorm(node: Any, g: OnnxGraph) -> bool:
    """ReduceMean whose input is also the other operand of a Sub it feeds (the mean of LayerNorm), or whose
    output goes through Add(eps) -> Sqrt (its variance)."""
    for consumer in g.consumers.get(node.output[0], []):
        if consumer.op_type == "Sub" and node.input[0] in consumer.input:
            return True
        if consumer.op_type == "Add" and any(c.op_type == "Sqrt" for c in g.consumers.get(consumer.output[0], [])):
            return True
    return False


def _in_gelu(node: Any, g: OnnxGraph) -> bool:
    """Erf fed by x/sqrt(2) (Div or Mul) and followed by Add(1): GELU's erf form."""
    src = g.producer.get(node.input[0])
    return src is not None and src.op_type in ("Div", "Mul") and any(
        c.op_type == "Add" for c in g.consumers.get(node.output[0], []))


_DIMS6, _DIMS4 = _dims_at_most(6), _dims_at_most(4)

#: ONNX operator -> check (TI's table, rows 1-49, and the fused combinations)
RULES: dict[str, Check] = {
    **{op: _DIMS6 for op in ("Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "Elu", "Squeeze",
                             "LayerNormalization", "BatchNormalization", "HardSwish", "Mish", "Sqrt", "Sin", "Pow",
                             "Log", "Floor", "Exp", "Asinh", "Asin", "Abs", "Sum", "Max")},
    "PRelu": _all(_DIMS6, _one_variable_input),
    "Clip": _all(_DIMS6, _clip),
    **{op: _all(_DIMS6, _eltwise) for op in ("Add", "Mul", "Sub", "Div")},
    "Concat": _all(_DIMS6, _concat),
    "Softmax": _all(_DIMS6, _softmax),
    "MatMul": _all(_DIMS4, _matmul),
    "Gemm": _all(_DIMS4, _matmul),
    "Conv": _all(_DIMS4, _one_variable_input, _conv),
    "ConvTranspose": _all(_DIMS4, _one_variable_input, _conv_transpose),
    "MaxPool": _all(_DIMS4, _pool),
    "AveragePool": _all(_DIMS4, _pool),
    "GlobalAveragePool": _DIMS4,
    "Reshape": _all(_DIMS6, _reshape),
    "Transpose": _all(_DIMS6, _transpose),
    "Flatten": _DIMS4,
    "Slice": _all(_DIMS4, _slice),
    "Split": _all(_DIMS4, _slice),
    "Resize": _all(_DIMS4, _resize),
    "Upsample": _all(_DIMS4, _resize),
    "DepthToSpace": _all(_DIMS4, _depth_to_space),
    "ArgMax": _all(_DIMS4, _argmax),
    "ReduceMax": _reduce_height,
    "ReduceMin": _reduce_height,
    "Pad": _pad,
    "Cast": _cast,
    "Gather": _DIMS4,
    "TopK": _DIMS4,
    "ReduceMean": _fused_only("LayerNorm", _in_layernorm),
    "Erf": _fused_only("GELU", _in_gelu),
}


def check_node(node: Any, g: OnnxGraph, lacks: frozenset) -> str | None:
    """None when TIDL runs ``node`` on the accelerator, else why not."""
    rule = RULES.get(node.op_type)
    if rule is None or node.domain not in ("", "ai.onnx"):
        return f"{node.op_type} is not in TIDL's operator list"
    return rule(node, g, lacks)
