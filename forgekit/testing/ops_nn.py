"""Op generators for :mod:`.graphgen`: pools, reductions, softmax, normalizations, casts and logic."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
from onnx import numpy_helper

from .graph import (
    _DT,
    Builder,
    Dim,
    Val,
    _axes_arg,
    _const_like,
    _neg_axis,
    _partner,
    _static,
    broadcast,
    dim_add,
    dim_range,
)


def _pool(op: str) -> Callable[[Builder], bool]:
    def gen(b: Builder) -> bool:
        x = b.pick(lambda v: v.rank in (3, 4))
        if x is None:
            return False
        sp = x.shape[2:]
        k = [int(b.choice([1, 2, 2, 3])) for _ in sp]
        st = [1 if isinstance(d, str) else int(b.choice([1, 2, 2])) for d in sp]
        dil = [int(b.choice([1, 1, 2])) if op == "MaxPool" else 1 for _ in sp]
        keff = [(kk - 1) * dd + 1 for kk, dd in zip(k, dil)]
        same = b.chance(0.2) and all(dd == 1 for dd in dil)
        if same:
            st = [min(s, kk) for s, kk in zip(st, k)]
        pads = [0] * (2 * len(sp)) if same else [int(b.rng.integers(0, kk)) if b.chance(0.5) else 0 for kk in k * 2]
        ceil = int(b.chance(0.3) and all(_static(d) for d in sp) and not same)
        out: list[Dim] = []
        for i, d in enumerate(sp):
            tot = pads[i] + pads[i + len(sp)] - keff[i]
            if same:
                out.append(d if isinstance(d, str) else -(-d // st[i]))
            elif isinstance(d, str):
                out.append(dim_add(d, tot + 1))
            else:
                o = (d + tot + (st[i] - 1 if ceil else 0)) // st[i] + 1
                if ceil and (o - 1) * st[i] >= d + pads[i]:
                    ceil = 0  # the last window would start in the right padding: ambiguous, avoid
                    return False
                out.append(o)
        shape = (x.shape[0], x.shape[1], *out)
        if b.too_big(shape):
            return False
        attrs: dict[str, Any] = {"kernel_shape": k, "strides": st}
        if same:
            attrs["auto_pad"] = "SAME_UPPER"
        elif any(pads) or b.chance(0.3):
            attrs["pads"] = pads
        if ceil:
            attrs["ceil_mode"] = 1
        if op == "MaxPool" and any(dd > 1 for dd in dil):
            attrs["dilations"] = dil
        lo, hi = x.lo, x.hi
        if op == "AveragePool" and b.chance(0.5):
            attrs["count_include_pad"] = 1
            lo, hi = min(lo, 0.0), max(hi, 0.0)
        b.add(op, [x.name], shape, lo=lo, hi=hi, exact=x.exact and op == "MaxPool", **attrs)
        return True
    return gen


def _global_pool(op: str) -> Callable[[Builder], bool]:
    def gen(b: Builder) -> bool:
        x = b.pick(lambda v: v.rank in (3, 4))
        if x is None:
            return False
        b.add(op, [x.name], (*x.shape[:2], *[1] * (x.rank - 2)), lo=x.lo, hi=x.hi,
              exact=x.exact and op == "GlobalMaxPool")
        return True
    return gen


def _reduce(op: str) -> Callable[[Builder], bool]:
    def gen(b: Builder) -> bool:
        dtype = "float32" if op == "ReduceMean" or b.chance(0.8) else b.choice(["int32", "int64"])
        v = b.pick(lambda v: v.rank >= 1, dtype=dtype)
        if v is None:
            return False
        keep = int(b.chance(0.5))
        axes = sorted(int(a) for a in b.rng.choice(v.rank, int(b.rng.integers(1, v.rank + 1)), replace=False))
        ins, attrs = [v.name], {"keepdims": keep}
        if b.chance(0.85):
            _axes_arg(b, ins, attrs, [_neg_axis(b, a, v.rank) for a in axes], b.opset >= 18 or op == "ReduceSum")
        else:
            axes = list(range(v.rank))
        shape = tuple(1 if i in axes else d for i, d in enumerate(v.shape) if keep or i not in axes)
        lo, hi = v.lo, v.hi
        if op == "ReduceSum":
            n = math.prod(dim_range(d)[1] for i, d in enumerate(v.shape) if i in axes)
            lo, hi = min(lo * n, lo), max(hi * n, hi)
            if dtype != "float32" and max(abs(lo), abs(hi)) > 2 ** 20:
                return False
        exact = (v.exact and op in ("ReduceMax", "ReduceMin")) or dtype != "float32"
        b.add(op, ins, shape, dtype, lo, hi, exact, **attrs)
        return True
    return gen


def _softmax(op: str) -> Callable[[Builder], bool]:
    def gen(b: Builder) -> bool:
        v = b.pick(lambda v: v.rank >= 1)
        if v is None:
            return False
        axis = int(b.rng.integers(v.rank))
        n = dim_range(v.shape[axis])[1]
        lo, hi = (0.0, 1.0) if op == "Softmax" else (-(v.hi - v.lo) - math.log(n), 0.0)
        attrs = {"axis": _neg_axis(b, axis, v.rank)} if b.chance(0.8) or axis != v.rank - 1 else {}
        b.add(op, [v.name], v.shape, lo=lo, hi=hi, **attrs)
        return True
    return gen


def gen_layernorm(b: Builder) -> bool:
    v = b.pick(lambda v: v.rank >= 1 and _static(v.shape[-1]))
    if v is None:
        return False
    axis = int(b.choice([a for a in range(v.rank) if all(_static(d) for d in v.shape[a:])]))
    norm = tuple(int(d) for d in v.shape[axis:])
    scale = b.rng.uniform(0.5, 1.5, norm).astype(np.float32)
    ins = [v.name, b.const(scale)]
    bias = 0.0
    if b.chance(0.7):
        bv = b.rng.standard_normal(norm).astype(np.float32) * 0.1
        ins.append(b.const(bv))
        bias = float(np.abs(bv).max())
    m = math.sqrt(math.prod(norm)) * float(scale.max()) + bias
    attrs: dict[str, Any] = {"axis": _neg_axis(b, axis, v.rank), "epsilon": float(b.choice([1e-5, 1e-3]))}
    b.add("LayerNormalization", ins, v.shape, lo=-m, hi=m, **attrs)
    return True


def gen_batchnorm(b: Builder) -> bool:
    v = b.pick(lambda v: v.rank >= 2 and _static(v.shape[1]))
    if v is None:
        return False
    c = int(v.shape[1])
    scale, bias = b.rng.uniform(0.5, 1.5, c), b.rng.standard_normal(c) * 0.1
    mean, var = b.rng.standard_normal(c) * 0.1, b.rng.uniform(0.5, 1.5, c)
    ins = [v.name] + [b.const(a.astype(np.float32)) for a in (scale, bias, mean, var)]
    m = (v.amax + 0.3) * float((scale / np.sqrt(var)).max()) + 0.5
    b.add("BatchNormalization", ins, v.shape, lo=-m, hi=m, epsilon=float(b.choice([1e-5, 1e-3])))
    return True


# ---------------------------------------------------------------------------------------------- dtypes, logic
def gen_cast(b: Builder) -> bool:
    v = b.pick(lambda v: v.exact and v.amax < 2 ** 20, dtype=None)
    if v is None or v.dtype == "bool":
        return False
    if v.dtype == "float32":  # x * 8 is exact, so truncation toward zero agrees everywhere
        m = b.add("Mul", [v.name, b.scalar(8.0)], v.shape, lo=v.lo * 8, hi=v.hi * 8, exact=True)
        to = b.choice(["int32", "int64"])
        b.add("Cast", [m.name], v.shape, to, math.trunc(m.lo), math.trunc(m.hi), True, to=_DT[to])
    else:
        to = b.choice(["float32", "float32", "int32" if v.dtype == "int64" else "int64"])
        b.add("Cast", [v.name], v.shape, to, v.lo, v.hi, True, to=_DT[to])
    return True


def _compare(b: Builder) -> Val | None:
    a = b.pick(lambda v: v.exact and v.rank >= 1, dtype=None)
    if a is None or a.dtype == "bool":
        return None
    op = b.choice(["Greater", "Less", "Equal"] if a.dtype != "float32" else ["Greater", "Less", "Less", "Greater",
                                                                             "Equal"])
    other = _partner(b, a, a.dtype, lambda v: v.exact) if b.chance(0.4) else None
    if other is not None:
        name, shape = other.name, broadcast(a.shape, other.shape)
    else:
        if a.dtype == "float32":
            arr = np.float32(np.round(b.rng.uniform(-0.5, 0.5), 2)) if op != "Equal" else np.float32(0.0)
        else:
            arr = np.array(int(b.rng.integers(-4, 5)), a.dtype)
        name, shape = b.const(np.asarray(arr), "c"), a.shape
    return b.add(op, [a.name, name], shape, "bool", 0, 1, True)


def gen_compare(b: Builder) -> bool:
    return _compare(b) is not None


def gen_where(b: Builder) -> bool:
    cond = b.pick(lambda v: v.rank >= 1, dtype="bool") if b.chance(0.5) else None
    cond = cond or _compare(b)
    if cond is None:
        return False
    dtype = "float32" if b.chance(0.8) else None
    x = b.pick(lambda v: broadcast(cond.shape, v.shape) is not None and v.dtype != "bool", dtype=dtype)
    if x is None:
        return False
    y = _partner(b, x, x.dtype, lambda v: broadcast(cond.shape, v.shape) is not None) if b.chance(0.4) else None
    if y is None:
        yname, _, ylo, yhi = _const_like(b, x, x.dtype)
        yshape: tuple[Dim, ...] = tuple(numpy_helper.to_array(b.inits[-1]).shape)
        yexact = True
    else:
        yname, yshape, ylo, yhi, yexact = y.name, y.shape, y.lo, y.hi, y.exact
    shape = broadcast(broadcast(cond.shape, x.shape) or (), yshape)
    if shape is None or broadcast(cond.shape, x.shape) is None or b.too_big(shape):
        return False
    b.add("Where", [cond.name, x.name, yname], shape, x.dtype, min(x.lo, ylo), max(x.hi, yhi), x.exact and yexact)
    return True
