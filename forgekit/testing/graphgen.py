"""Random *valid* ONNX graphs for differential testing (NNSmith-style, offline, deterministic).

:func:`generate` grows a graph node by node from one or two graph inputs.  Every value's shape, dtype
and a conservative value interval are tracked, so each op generator (one small function per op,
registered in :data:`OPS` as ``name -> (gen(builder) -> bool, weight, min opset, weight factor when
dynamic)``) only emits nodes whose output is
well defined: denominators are kept away from zero, Log/Sqrt see positive inputs, Exp bounded ones,
and float->int casts and float comparisons only read *exact* values (computed by rounding-free ops),
so every backend agrees bit for bit on them.

Dynamic graphs give the input a symbolic batch ``N`` (1..8) and sometimes a symbolic spatial or
sequence dim ``W`` (8..24).  Dims are ints or strings: a base symbol, or an affine offset of one
(``"W-2"``, after a valid conv or a slice such as ``x[:, :-2]``); an op may only be emitted when its
output is valid for every value of the symbols in range.  :func:`feeds_for` builds inputs at several
sizes (batch 1, 3 and 8) from the model alone, so a shrunk model can still be fed.
"""


from __future__ import annotations

from typing import Any, Callable

import numpy as np
import onnx
from onnx import helper

from .graph import _DT, SYMBOLS, Builder, Dim, GeneratedGraph, Val, _prod_dim
from .ops_math import _MONO, _binary, _unary, gen_conv, gen_conv_transpose, gen_gemm, gen_matmul
from .ops_nn import (
    _global_pool,
    _pool,
    _reduce,
    _softmax,
    gen_batchnorm,
    gen_cast,
    gen_compare,
    gen_layernorm,
    gen_where,
)
from .ops_shape import (
    gen_concat,
    gen_flatten,
    gen_pad,
    gen_reshape,
    gen_resize,
    gen_shape_reshape,
    gen_slice,
    gen_split,
    gen_squeeze,
    gen_transpose,
    gen_unsqueeze,
    keras_slice,
)


def dense_head(b: Builder) -> None:
    """A classifier head on the newest float value: flatten, dense, activation (optionally softmax)."""
    v = b.pick(lambda v: v.rank >= 2 and _prod_dim(v.shape[1:]) is not None and isinstance(_prod_dim(v.shape[1:]), int)
               and int(_prod_dim(v.shape[1:])) <= 2048)  # type: ignore[arg-type]
    if v is None:
        return
    if v.rank > 2:
        if not (gen_shape_reshape(b) if b.chance(0.3) else False):
            b.add("Flatten", [v.name], (v.shape[0], _prod_dim(v.shape[1:])), lo=v.lo, hi=v.hi, exact=v.exact, axis=1)
    if not gen_gemm(b):
        gen_matmul(b)
    _unary(b.choice(["Relu", "Tanh", "Sigmoid"]))(b)
    if b.chance(0.5):
        _softmax("Softmax")(b)


#: op name -> (generator, weight, minimum opset, weight factor in dynamic graphs)
OPS: dict[str, tuple[Callable[[Builder], bool], float, int, float]] = {
    "Conv": (gen_conv, 3.0, 13, 1.5), "ConvTranspose": (gen_conv_transpose, 1.0, 13, 0.5),
    "MatMul": (gen_matmul, 2.5, 13, 2.0), "Gemm": (gen_gemm, 1.5, 13, 2.0),
    "Reshape": (gen_reshape, 2.0, 13, 2.0), "ShapeReshape": (gen_shape_reshape, 0.7, 13, 3.0),
    "Flatten": (gen_flatten, 1.0, 13, 2.0), "Transpose": (gen_transpose, 1.5, 13, 1.0),
    "Squeeze": (gen_squeeze, 0.7, 13, 1.0), "Unsqueeze": (gen_unsqueeze, 0.7, 13, 1.0),
    "Slice": (gen_slice, 2.5, 13, 2.5), "Concat": (gen_concat, 1.5, 13, 1.0), "Split": (gen_split, 1.0, 13, 1.0),
    "Pad": (gen_pad, 1.2, 13, 1.0), "Resize": (gen_resize, 1.0, 13, 0.5),
    "MaxPool": (_pool("MaxPool"), 1.0, 13, 1.0), "AveragePool": (_pool("AveragePool"), 1.0, 13, 1.0),
    "GlobalAveragePool": (_global_pool("GlobalAveragePool"), 0.6, 13, 1.0),
    "GlobalMaxPool": (_global_pool("GlobalMaxPool"), 0.3, 13, 1.0),
    "Softmax": (_softmax("Softmax"), 0.8, 13, 1.0), "LogSoftmax": (_softmax("LogSoftmax"), 0.5, 13, 1.0),
    "LayerNormalization": (gen_layernorm, 1.0, 17, 1.0), "BatchNormalization": (gen_batchnorm, 0.8, 13, 1.0),
    "Cast": (gen_cast, 0.8, 13, 1.0), "Compare": (gen_compare, 0.4, 13, 1.0), "Where": (gen_where, 0.8, 13, 1.0),
    "HardSwish": (_unary("HardSwish"), 0.3, 14, 1.0), "Abs": (_unary("Abs"), 0.3, 13, 1.0),
    "Clip": (_unary("Clip"), 0.4, 13, 1.0), "Gelu": (_unary("Gelu"), 0.5, 13, 1.0),
}
OPS.update({op: (_unary(op), 0.3 if op not in ("Relu", "Sigmoid", "Tanh") else 0.6, 13, 1.0) for op in _MONO})
OPS.update({op: (_binary(op), 1.0 if op in ("Add", "Mul") else 0.5, 13, 1.0)
            for op in ("Add", "Sub", "Mul", "Div", "Max", "Min", "Pow")})
OPS.update({op: (_reduce(op), 0.5, 13, 1.5) for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin")})


# ---------------------------------------------------------------------------------------------- generate
def _value_info(v: Val) -> onnx.ValueInfoProto:
    dims: list[Any] = [d if isinstance(d, int) or d in SYMBOLS else None for d in v.shape]
    vi = helper.make_tensor_value_info(v.name, _DT[v.dtype], [d if d is not None else "" for d in dims])
    for d, proto in zip(dims, vi.type.tensor_type.shape.dim):
        if d is None:
            proto.ClearField("dim_param")  # an affine dim ("W-2"): declared unknown
    return vi


def _make_inputs(b: Builder) -> None:
    kind = b.choice(["image", "image", "seq", "chan", "dense"])
    dyn_w = b.dynamic and b.chance(0.35)
    batch: Dim = "N" if b.dynamic else int(b.choice([1, 1, 2, 3]))
    w: Dim = "W" if dyn_w else int(b.rng.integers(3, 11))
    if kind == "image":
        shape: tuple[Dim, ...] = (batch, int(b.choice([1, 2, 3, 4, 8])), int(b.rng.integers(3, 10)), w)
    elif kind == "seq":
        shape = (batch, w, int(b.choice([4, 6, 8, 12, 16])))
    elif kind == "chan":
        shape = (batch, int(b.choice([1, 2, 4, 6, 8])), w)
    else:
        shape = (batch, int(b.choice([4, 8, 12, 16, 32])))
    b.inputs.append(Val("x", shape, "float32", -1.0, 1.0, True))
    if b.chance(0.25):  # a second input, same shape or a broadcastable suffix
        shape2 = shape if b.chance(0.5) else (1,) * int(b.chance(0.5)) + shape[1:]
        b.inputs.append(Val("y", shape2, "float32", -1.0, 1.0, True))
    b.vals.extend(b.inputs)


def generate(seed: int, *, dynamic: bool | None = None, max_nodes: int = 8, ops: set[str] | None = None,
             opset: int | None = None, huge_ends: bool = True) -> GeneratedGraph:
    """A random valid ONNX model from ``seed`` (same seed, same bytes).

    ``dynamic``: symbolic input dims (None: one graph in two); ``max_nodes``: op generators applied (guard
    and helper nodes come on top); ``ops``: restrict to these keys of :data:`OPS`; ``huge_ends=False``:
    no INT32_MAX/INT64_MAX Slice bounds on symbolic dims (they used to hit an import bug that masked others).
    """
    rng = np.random.default_rng(seed)
    if dynamic is None:
        dynamic = bool(rng.random() < 0.5)
    opset = opset or int(rng.choice([13, 14, 15, 16, 17, 18, 18, 17]))
    b = Builder(rng, opset, dynamic, huge_ends)
    _make_inputs(b)
    table = {k: v for k, v in OPS.items() if (ops is None or k in ops) and v[2] <= opset}
    if not table:
        raise ValueError(f"no generator for ops={ops} at opset {opset}")
    names = sorted(table)
    weights = np.array([table[k][1] * (table[k][3] if dynamic else 1.0) for k in names])
    applied: list[str] = []
    if dynamic and (ops is None or "Slice" in ops) and b.chance(0.5) and keras_slice(b):
        applied.append("Slice")  # x[:, a:] with INT64_MAX ends, the tf2onnx pattern
    attempts = 0
    while len(applied) < max_nodes and attempts < max_nodes * 8:
        attempts += 1
        op = names[int(rng.choice(len(names), p=weights / weights.sum()))]
        mark = (len(b.nodes), len(b.vals), len(b.inits), b.counter, set(b.used))
        if table[op][0](b):
            applied.append(op)
        else:  # roll back anything a failed generator emitted
            b.nodes[mark[0]:], b.vals[mark[1]:], b.inits[mark[2]:] = [], [], []
            b.used = mark[4]
    if dynamic and rng.random() < 0.6 and (ops is None or "dense_head" in ops):
        dense_head(b)
        applied.append("dense_head")
    outputs = [v for v in b.vals if v.name not in b.used and v not in b.inputs][-6:]
    if not outputs:
        outputs = [b.add("Identity", [b.vals[-1].name], b.vals[-1].shape, b.vals[-1].dtype)]
    graph = helper.make_graph(b.nodes, f"fuzz_{seed}", [_value_info(v) for v in b.inputs],
                              [_value_info(v) for v in outputs], initializer=b.inits)
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="forgekit.testing.graphgen")
    model.ir_version = helper.find_min_ir_version_for(opsets)
    onnx.checker.check_model(model, full_check=True)
    sig = ", ".join(f"{v.name}[{','.join(map(str, v.shape))}]" for v in b.inputs)
    op_types = [n.op_type for n in b.nodes]
    desc = f"seed {seed} opset {opset} {'dynamic' if dynamic else 'static'} {sig}: {' > '.join(applied)}"
    dyn = {s: SYMBOLS[s] for v in b.inputs for s in v.shape if isinstance(s, str)}
    return GeneratedGraph(seed, model, desc, op_types, dyn)
