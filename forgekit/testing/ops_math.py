"""Op generators for :mod:`.graphgen`: elementwise unary and binary ops, convolutions, matmul, gemm."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
from onnx import numpy_helper

from .graph import Builder, Dim, _bounded, _const_like, _iv, _mul_iv, _partner, _positive, _static, broadcast, dim_add

# ---------------------------------------------------------------------------------------------- unary
_MONO: dict[str, tuple[Callable[[Builder], dict], Callable[[dict], Callable[[float], float]]]] = {
    "Relu": (lambda b: {}, lambda a: lambda x: max(x, 0.0)),
    "LeakyRelu": (lambda b: {"alpha": float(b.choice([0.01, 0.1, 0.2]))},
                  lambda a: lambda x: x if x > 0 else a["alpha"] * x),
    "Sigmoid": (lambda b: {}, lambda a: lambda x: 1 / (1 + np.exp(-x))),
    "Tanh": (lambda b: {}, lambda a: np.tanh),
    "HardSigmoid": (lambda b: {"alpha": float(b.choice([0.2, 1 / 6])), "beta": 0.5},
                    lambda a: lambda x: min(max(a["alpha"] * x + a["beta"], 0.0), 1.0)),
    "Elu": (lambda b: {"alpha": float(b.choice([1.0, 0.5]))},
            lambda a: lambda x: x if x > 0 else a["alpha"] * (np.exp(x) - 1)),
    "Selu": (lambda b: {} if b.chance(0.5) else {"alpha": 1.5, "gamma": 1.1},
             lambda a: lambda x: a.get("gamma", 1.0507) * (x if x > 0 else a.get("alpha", 1.6733) * (np.exp(x) - 1))),
    "Softplus": (lambda b: {}, lambda a: lambda x: np.logaddexp(0, x)),
    "Exp": (lambda b: {}, lambda a: np.exp),
    "Log": (lambda b: {}, lambda a: np.log),
    "Sqrt": (lambda b: {}, lambda a: np.sqrt),
    "Erf": (lambda b: {}, lambda a: math.erf),
    "Neg": (lambda b: {}, lambda a: lambda x: -x),
}
_EXACT_UNARY = {"Relu", "Neg", "Abs", "Clip"}


def _unary(op: str) -> Callable[[Builder], bool]:
    def gen(b: Builder) -> bool:
        v = b.pick()
        if v is None:
            return False
        if op == "Exp":
            v = _bounded(b, v, 4.0)
        elif op == "Log":
            v = _positive(b, v, 0.1)
        elif op == "Sqrt":
            v = _positive(b, v, 0.01)
        if op in _MONO:
            attrs = _MONO[op][0](b)
            lo, hi = _iv(_MONO[op][1](attrs), v.lo, v.hi)
            b.add(op, [v.name], v.shape, lo=lo, hi=hi, exact=v.exact and op in _EXACT_UNARY, **attrs)
        elif op == "Abs":
            b.add(op, [v.name], v.shape, lo=0.0, hi=v.amax, exact=v.exact)
        elif op == "HardSwish":
            b.add(op, [v.name], v.shape, lo=-0.375, hi=max(v.hi, 0.0))
        elif op == "Clip":
            mn, mx = sorted(float(x) for x in np.round(b.rng.uniform(-1, 1, 2), 2))
            mx += 0.1
            ins = [v.name, b.scalar(mn) if b.chance(0.8) else "", b.scalar(mx) if b.chance(0.8) else ""]
            lo, hi = (max(v.lo, mn) if ins[1] else v.lo), (min(v.hi, mx) if ins[2] else v.hi)
            b.add(op, ins if ins[2] else ins[:2], v.shape, lo=min(lo, hi), hi=max(lo, hi), exact=v.exact)
        elif op == "Gelu":  # the Erf pattern exporters emit: x * 0.5 * (1 + erf(x / sqrt 2))
            d = b.add("Div", [v.name, b.scalar(1.4142135)], v.shape, keep=False)
            e = b.add("Erf", [d.name], v.shape, keep=False)
            a = b.add("Add", [e.name, b.scalar(1.0)], v.shape, keep=False)
            m = b.add("Mul", [v.name, a.name], v.shape, keep=False)
            b.add("Mul", [m.name, b.scalar(0.5)], v.shape, lo=-0.2, hi=max(v.hi, 0.0))
        return True
    return gen


# ---------------------------------------------------------------------------------------------- binary
def _binary(op: str) -> Callable[[Builder], bool]:
    def gen(b: Builder) -> bool:
        dtype = "float32" if op == "Pow" or b.chance(0.8) else b.choice(["int32", "int64"])
        a = b.pick(lambda v: v.rank >= 1 or dtype != "float32", dtype=dtype)
        if a is None:
            return False
        other = _partner(b, a, dtype) if b.chance(0.5) and op not in ("Pow",) else None
        if op == "Div" and dtype != "float32":  # integer division: positive constant denominators
            other = None
        if other is not None:
            if op == "Div":
                other = _positive(b, other, 0.5)
            bname, bshape, blo, bhi, bexact = other.name, other.shape, other.lo, other.hi, other.exact
        elif op == "Pow":
            e = float(b.choice([2.0, 3.0, 0.5, 1.5, -1.0, 2.0]))
            if e != int(e) or e < 0:
                a = _positive(b, a, 0.5 if e < 0 else 0.1)
            bname, bshape, blo, bhi, bexact = b.scalar(e, (1,) if b.chance(0.5) else ()), (), e, e, True
        else:
            bname, bshape, blo, bhi = _const_like(b, a, dtype)
            bexact = True
            if op == "Div":
                arr = numpy_helper.to_array(b.inits[-1])
                if dtype == "float32":
                    arr = np.where(arr >= 0, 1, -1) * (0.5 + np.abs(arr))
                else:
                    arr = np.abs(arr) % 5 + 1
                b.inits[-1].CopyFrom(numpy_helper.from_array(arr.astype(dtype), bname))
                blo, bhi = float(arr.min(initial=0)), float(arr.max(initial=0))
        shape = broadcast(a.shape, bshape)
        if shape is None or b.too_big(shape):
            return False
        if op == "Add":
            lo, hi = a.lo + blo, a.hi + bhi
        elif op == "Sub":
            lo, hi = a.lo - bhi, a.hi - blo
        elif op == "Mul":
            lo, hi = _mul_iv(a, blo, bhi)
        elif op == "Div":
            m = a.amax / 0.5
            lo, hi = (-m, m) if dtype == "float32" else (-a.amax, a.amax)
        elif op == "Max":
            lo, hi = max(a.lo, blo), max(a.hi, bhi)
        elif op == "Min":
            lo, hi = min(a.lo, blo), min(a.hi, bhi)
        else:  # Pow, constant exponent
            lo, hi = _iv(lambda x: x ** blo, a.lo, a.hi, (0.0,))
        if dtype != "float32" and max(abs(lo), abs(hi)) > 2 ** 20:
            return False
        ins = [bname, a.name] if op in ("Add", "Mul", "Max", "Min") and b.chance(0.3) else [a.name, bname]
        exact = dtype != "float32" or (op in ("Max", "Min") and a.exact and bexact)
        b.add(op, ins, shape, dtype, lo=lo, hi=hi, exact=exact)
        return True
    return gen


# ---------------------------------------------------------------------------------------------- linear algebra
def gen_conv(b: Builder) -> bool:
    x = b.pick(lambda v: v.rank in (3, 4) and _static(v.shape[1]) and v.shape[1] <= 32)
    if x is None:
        return False
    c, sp = int(x.shape[1]), x.shape[2:]
    g = int(b.choice([1, 1, c] + [d for d in range(2, c) if c % d == 0]))
    m = g * int(b.choice([1, 2])) if g > 1 else int(b.choice([2, 4, 8, 16]))
    k = [int(b.choice([1, 2, 3, 3])) for _ in sp]
    dil = [int(b.choice([1, 1, 1, 2])) for _ in sp]
    st = [1 if isinstance(d, str) else int(b.choice([1, 1, 2])) for d in sp]
    keff = [(kk - 1) * dd + 1 for kk, dd in zip(k, dil)]
    mode = b.choice(["pads", "pads", "SAME_UPPER", "VALID"])
    if mode == "SAME_UPPER":  # onnxruntime: no dilation with auto_pad SAME; a stride above the kernel pads < 0
        dil, keff = [1] * len(sp), k
        st = [min(s, kk) for s, kk in zip(st, k)]
    pads = [0] * (2 * len(sp)) if mode == "VALID" else [int(b.rng.integers(0, ke)) for ke in keff * 2]
    out: list[Dim] = []
    for i, d in enumerate(sp):
        if mode == "SAME_UPPER":
            out.append(d if isinstance(d, str) else -(-d // st[i]))
        elif isinstance(d, str):
            out.append(dim_add(d, pads[i] + pads[i + len(sp)] - keff[i] + 1))
        else:
            out.append((d + pads[i] + pads[i + len(sp)] - keff[i]) // st[i] + 1)
    shape = (x.shape[0], m, *out)
    if b.too_big(shape):
        return False
    w = b.weight((m, c // g, *k), c // g * math.prod(k))
    ins = [x.name, b.const(w)]
    bias = b.rng.standard_normal(m).astype(np.float32) * 0.1 if b.chance(0.6) else None
    if bias is not None:
        ins.append(b.const(bias))
    attrs: dict[str, Any] = {"group": g, "strides": st, "dilations": dil}
    if mode == "pads":
        attrs["pads"] = pads
    else:
        attrs["auto_pad"] = mode
    if b.chance(0.5):
        attrs["kernel_shape"] = k
    amax = x.amax * float(np.abs(w).reshape(m, -1).sum(1).max())
    amax += float(np.abs(bias).max()) if bias is not None else 0.0
    b.add("Conv", ins, shape, lo=-amax, hi=amax, **attrs)
    return True


def gen_conv_transpose(b: Builder) -> bool:
    x = b.pick(lambda v: v.rank in (3, 4) and all(_static(d) for d in v.shape[1:]) and v.shape[1] <= 16)
    if x is None:
        return False
    c, sp = int(x.shape[1]), x.shape[2:]
    g = c if c > 1 and b.chance(0.3) else 1
    mpg = int(b.choice([1, 2, 4]))
    k = [int(b.choice([1, 2, 3])) for _ in sp]
    st = [int(b.choice([1, 2, 2])) for _ in sp]
    dil = [int(b.choice([1, 1, 2])) for _ in sp]
    keff = [(kk - 1) * dd + 1 for kk, dd in zip(k, dil)]
    pads = [int(b.rng.integers(0, ke)) for ke in keff * 2]
    opad = [int(b.rng.integers(0, s)) if b.chance(0.3) else 0 for s in st]
    out = [s * (int(d) - 1) + op + ke - pads[i] - pads[i + len(sp)]
           for i, (d, s, op, ke) in enumerate(zip(sp, st, opad, keff))]
    shape = (x.shape[0], mpg * g, *out)
    if b.too_big(shape):
        return False
    w = b.weight((c, mpg, *k), c // g * math.prod(k) // max(1, math.prod(st)))
    ins = [x.name, b.const(w)]
    if b.chance(0.5):
        ins.append(b.const(b.rng.standard_normal(mpg * g).astype(np.float32) * 0.1))
    attrs: dict[str, Any] = {"group": g, "strides": st, "dilations": dil, "pads": pads}
    if any(opad):
        attrs["output_padding"] = opad
    amax = x.amax * float(np.abs(w).reshape(g, c // g, mpg, -1).sum(axis=(1, 3)).max()) + 0.5
    b.add("ConvTranspose", ins, shape, lo=-amax, hi=amax, **attrs)
    return True


def _matmul_shape(sa: tuple[Dim, ...], sb: tuple[Dim, ...]) -> tuple[Dim, ...] | None:
    a2 = sa if len(sa) >= 2 else (1, *sa)
    b2 = sb if len(sb) >= 2 else (*sb, 1)
    if a2[-1] != b2[-2]:
        return None
    batch = broadcast(a2[:-2], b2[:-2])
    if batch is None:
        return None
    return (*batch, *(a2[-2:-1] if len(sa) >= 2 else ()), *(b2[-1:] if len(sb) >= 2 else ()))


def gen_matmul(b: Builder) -> bool:
    a = b.pick(lambda v: v.rank >= 1 and _static(v.shape[-1]) and v.shape[-1] <= 64)
    if a is None:
        return False
    k = int(a.shape[-1])
    other = b.pick(lambda v: v is not a and v.rank >= 2 and _matmul_shape(a.shape, v.shape) is not None) \
        if b.chance(0.3) else None
    if other is not None:
        bname, bshape, bl1 = other.name, other.shape, other.amax * k
    else:
        n = int(b.choice([1, 3, 4, 8, 16]))
        bshape = (k, n)
        if a.rank >= 3 and b.chance(0.4):
            bshape = (*[1 if isinstance(d, str) or b.chance(0.5) else d for d in a.shape[-3:-2]], k, n)
        elif b.chance(0.1):
            bshape = (k,)
        w = b.weight(bshape, k)
        bname, bl1 = b.const(w), float(np.abs(w).sum(axis=-2 if len(bshape) > 1 else 0).max())
    shape = _matmul_shape(a.shape, bshape)
    if shape is None or b.too_big(shape):
        return False
    amax = a.amax * bl1
    b.add("MatMul", [a.name, bname], shape, lo=-amax, hi=amax)
    return True


def gen_gemm(b: Builder) -> bool:
    ta = int(b.chance(0.25))
    a = b.pick(lambda v: v.rank == 2 and _static(v.shape[1 - ta]) and int(v.shape[1 - ta]) <= 64)
    if a is None:
        return False
    k, rows, n, tb = int(a.shape[1 - ta]), a.shape[ta], int(b.choice([1, 4, 8, 10, 16])), int(b.chance(0.5))
    alpha, beta = float(b.choice([1.0, 1.0, 0.5, 2.0])), float(b.choice([1.0, 1.0, 0.5, -1.0]))
    w = b.weight((n, k) if tb else (k, n), k)
    ins = [a.name, b.const(w)]
    cshape = b.choice([(n,), (1, n), (rows, n), (1,), None])
    if cshape is not None and not all(_static(d) for d in cshape):
        cshape = (n,)
    cmax = 0.0
    if cshape is not None:
        cv = b.rng.standard_normal(cshape).astype(np.float32) * 0.3
        ins.append(b.const(cv))
        cmax = float(np.abs(cv).max()) * abs(beta)
    attrs = {"transA": ta, "transB": tb, "alpha": alpha, "beta": beta}
    attrs = {k2: v for k2, v in attrs.items() if v != (0 if k2.startswith("trans") else 1.0) or b.chance(0.5)}
    amax = a.amax * float(np.abs(w).sum(axis=1 if tb else 0).max()) * abs(alpha) + cmax
    b.add("Gemm", ins, (rows, n), lo=-amax, hi=amax, **attrs)
    return True
