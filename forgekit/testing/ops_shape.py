"""Op generators for :mod:`.graphgen`: reshapes, slices, concat/split, pad, resize."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .graph import INT32_MAX, INT64_MAX, INT64_MIN, Builder, Dim, Val, _neg_axis, _prod_dim, _static, dim_add, dim_range


# ---------------------------------------------------------------------------------------------- shapes
def _factorize(b: Builder, n: int, rank: int) -> list[int]:
    dims = []
    for _ in range(rank - 1):
        d = int(b.choice([d for d in range(1, n + 1) if n % d == 0]))
        dims.append(d)
        n //= d
    dims.append(n)
    b.rng.shuffle(dims)
    return dims


def gen_reshape(b: Builder) -> bool:
    v = b.pick(lambda v: v.rank >= 1 and sum(isinstance(d, str) for d in v.shape) <= 1, dtype=None)
    if v is None:
        return False
    syms = [(i, d) for i, d in enumerate(v.shape) if isinstance(d, str)]
    total = math.prod(d for d in v.shape if isinstance(d, int))
    new: list[Dim] = list(_factorize(b, total, int(b.rng.integers(1, 4))))
    if syms:
        q = syms[0][0] if syms[0][0] <= len(new) and b.chance(0.6) else int(b.rng.integers(0, len(new) + 1))
        new.insert(q, syms[0][1])
    spec: list[int] = []
    minus = False
    for i, d in enumerate(new):
        same = i < v.rank and v.shape[i] == d
        if isinstance(d, str):
            if same:
                spec.append(0)
            elif minus:
                return False
            else:
                spec.append(-1)
                minus = True
        elif same and b.chance(0.4):
            spec.append(0)
        else:
            spec.append(d)
    if not minus and not syms and b.chance(0.5):
        spec[int(b.rng.integers(len(spec)))] = -1
    b.add("Reshape", [v.name, b.ints(spec)], tuple(new), v.dtype, v.lo, v.hi, v.exact)
    return True


def gen_shape_reshape(b: Builder) -> bool:
    """PyTorch's ``x.view(x.size(0), -1)``: Shape -> Slice/Gather -> Concat -> Reshape."""
    v = b.pick(lambda v: v.rank >= 2 and all(_static(d) for d in v.shape[1:]), dtype=None)
    if v is None:
        return False
    shp = b.add("Shape", [v.name], (v.rank,), "int64", keep=False)
    if b.chance(0.5):
        head = b.add("Slice", [shp.name, b.ints([0]), b.ints([1])], (1,), "int64", keep=False)
    else:
        g = b.add("Gather", [shp.name, b.ints(0)], (), "int64", keep=False, axis=0)
        head = b.add("Unsqueeze", [g.name, b.ints([0])], (1,), "int64", keep=False)
    cat = b.add("Concat", [head.name, b.ints([-1])], (2,), "int64", keep=False, axis=0)
    b.add("Reshape", [v.name, cat.name], (v.shape[0], math.prod(v.shape[1:])), v.dtype, v.lo, v.hi, v.exact)
    return True


def gen_flatten(b: Builder) -> bool:
    v = b.pick(lambda v: v.rank >= 1, dtype=None)
    if v is None:
        return False
    axis = int(b.rng.integers(0, v.rank + 1))
    left, right = _prod_dim(v.shape[:axis]), _prod_dim(v.shape[axis:])
    if left is None or right is None:
        return False
    b.add("Flatten", [v.name], (left, right), v.dtype, v.lo, v.hi, v.exact,
          axis=_neg_axis(b, axis, v.rank) if axis < v.rank else axis)
    return True


def gen_transpose(b: Builder) -> bool:
    v = b.pick(lambda v: v.rank >= 2, dtype=None)
    if v is None:
        return False
    attrs = {}
    perm = list(range(v.rank))[::-1]
    if b.chance(0.8):
        perm = [int(p) for p in b.rng.permutation(v.rank)]
        attrs["perm"] = perm
    b.add("Transpose", [v.name], tuple(v.shape[p] for p in perm), v.dtype, v.lo, v.hi, v.exact, **attrs)
    return True


def gen_squeeze(b: Builder) -> bool:
    v = b.pick(lambda v: 1 in v.shape, dtype=None)
    if v is None:
        return False
    ones = [i for i, d in enumerate(v.shape) if d == 1]
    axes = sorted(int(a) for a in b.rng.choice(ones, int(b.rng.integers(1, len(ones) + 1)), replace=False))
    ins = [v.name]
    all_static = all(_static(d) for d in v.shape)
    if not (all_static and len(axes) == len(ones) and b.chance(0.3)):
        ins.append(b.ints([_neg_axis(b, a, v.rank) for a in axes]))
    b.add("Squeeze", ins, tuple(d for i, d in enumerate(v.shape) if i not in axes), v.dtype, v.lo, v.hi, v.exact)
    return True


def gen_unsqueeze(b: Builder) -> bool:
    v = b.pick(lambda v: v.rank <= 4, dtype=None)
    if v is None:
        return False
    r = v.rank + int(b.rng.integers(1, 3 if v.rank <= 3 else 2))
    axes = sorted(int(a) for a in b.rng.choice(r, r - v.rank, replace=False))
    rest = iter(v.shape)
    shape = tuple(1 if i in axes else next(rest) for i in range(r))
    b.add("Unsqueeze", [v.name, b.ints([_neg_axis(b, a, r) for a in axes])], shape, v.dtype, v.lo, v.hi, v.exact)
    return True


def _slice_axis(b: Builder, d: Dim) -> tuple[int, int, int, Dim] | None:
    """(start, end, step, output dim) valid for every value of ``d``."""
    if isinstance(d, str):
        lo = dim_range(d)[0]
        pats = [(0, INT64_MAX, 1, d), (0, INT64_MAX, 1, d), (0, INT32_MAX, 1, d), (-1, INT64_MIN, -1, d),
                (INT64_MAX, -INT64_MAX, -1, d), (-1, INT64_MAX, 1, 1), (0, 1, 1, 1)]
        if lo >= 2:
            a = int(b.rng.integers(1, lo))
            pats += [(a, INT64_MAX, 1, dim_add(d, -a)), (0, -a, 1, dim_add(d, -a)), (-a, INT64_MAX, 1, a),
                     (0, a, 1, a), (a, INT32_MAX, 1, dim_add(d, -a)), (-a - 1, -a, 1, 1)]
        if not b.huge_ends:
            pats = [p for p in pats if max(abs(p[0]), abs(p[1])) < INT32_MAX] or [(0, 1, 1, 1)]
        return b.choice(pats)
    for _ in range(12):
        step = int(b.choice([1, 1, 1, 2, 3, -1, -1, -2]))
        r = int(b.rng.integers(-d, d + 1))
        if step > 0:
            start = int(b.choice([0, 0, 1, -1, -2, -d, r, d + 3]))
            end = int(b.choice([INT64_MAX, INT64_MAX, INT32_MAX, -1, d, d + 5, r, -INT64_MAX]))
        else:
            start = int(b.choice([-1, INT64_MAX, d + 3, d - 1, r]))
            end = int(b.choice([INT64_MIN, -INT64_MAX, -d - 1, -d - 5, 0, r]))
        n = len(range(*slice(start, end, step).indices(d)))
        if n >= 1:
            return start, end, step, n
    return None


def _emit_slice(b: Builder, v: Val, axes: list[int], pats: list[tuple[int, int, int, Dim]]) -> None:
    shape = list(v.shape)
    for a, p in zip(axes, pats):
        shape[a] = p[3]
    starts, ends, steps = [p[0] for p in pats], [p[1] for p in pats], [p[2] for p in pats]
    small = all(-2 ** 31 <= x < 2 ** 31 for x in starts + ends)
    idt = np.int32 if small and b.chance(0.2) else np.int64
    ins = [v.name, b.ints(starts, idt), b.ints(ends, idt)]
    if axes != list(range(len(axes))) or b.chance(0.6) or any(s != 1 for s in steps):
        ins.append(b.ints([_neg_axis(b, a, v.rank) for a in axes], idt))
        if any(s != 1 for s in steps) or b.chance(0.5):
            ins.append(b.ints(steps, idt))
    b.add("Slice", ins, tuple(shape), v.dtype, v.lo, v.hi, v.exact)


def gen_slice(b: Builder) -> bool:
    v = b.pick(lambda v: v.rank >= 1, dtype=None)
    if v is None:
        return False
    n = int(b.rng.integers(1, min(v.rank, 3) + 1))
    axes = [int(a) for a in b.rng.choice(v.rank, n, replace=False)]
    if b.dynamic and 0 not in axes and b.chance(0.5):
        axes[0] = 0
    pats = [_slice_axis(b, v.shape[a]) for a in axes]
    if any(p is None for p in pats) or len(set(axes)) != len(axes):
        return False
    _emit_slice(b, v, axes, pats)  # type: ignore[arg-type]
    return True


def keras_slice(b: Builder) -> bool:
    """``x[:, a:]`` as tf2onnx writes it: axes [0, j], ends INT64_MAX on both (batch symbolic)."""
    v = b.inputs[0]
    j = int(b.rng.integers(1, v.rank)) if v.rank > 1 else 0
    lo = dim_range(v.shape[j])[0]
    a = int(b.rng.integers(0, lo))
    end = INT64_MAX if (b.chance(0.7) or lo - a < 2) and (b.huge_ends or _static(v.shape[j])) else -1
    if end == -1 and lo - a < 2:
        a = 0
    pat = (a, end, 1, dim_add(v.shape[j], -a - (end == -1)))
    if not j:
        return False
    if b.huge_ends:
        _emit_slice(b, v, [0, j], [(0, INT64_MAX, 1, v.shape[0]), pat])
    else:  # without huge ends the symbolic batch axis cannot be spelled "to the end": leave it out
        _emit_slice(b, v, [j], [pat])
    return True


def gen_concat(b: Builder) -> bool:
    a = b.pick(lambda v: v.rank >= 1, dtype=None)
    if a is None:
        return False
    axis = int(b.rng.integers(a.rank))

    def fits(v: Val) -> bool:
        return v.rank == a.rank and all(x == y for i, (x, y) in enumerate(zip(a.shape, v.shape)) if i != axis)

    parts = [a] + [p for p in [b.pick(fits, dtype=a.dtype) for _ in range(int(b.rng.integers(1, 3)))] if p]
    if len(parts) == 1:
        parts.append(a)
    total: Dim = 0
    for p in parts:
        d = p.shape[axis]
        if isinstance(d, str) and isinstance(total, str):
            return False
        total = dim_add(d, total) if isinstance(d, str) else dim_add(total, d)  # type: ignore[arg-type]
    shape = tuple(total if i == axis else d for i, d in enumerate(a.shape))
    if b.too_big(shape):
        return False
    b.add("Concat", [p.name for p in parts], shape, a.dtype, min(p.lo for p in parts), max(p.hi for p in parts),
          all(p.exact for p in parts), axis=_neg_axis(b, axis, a.rank))
    return True


def gen_split(b: Builder) -> bool:
    v = b.pick(lambda v: any(_static(d) and d >= 2 for d in v.shape), dtype=None)
    if v is None:
        return False
    axis = int(b.choice([i for i, d in enumerate(v.shape) if _static(d) and d >= 2]))
    d = int(v.shape[axis])
    n = int(b.rng.integers(2, min(d, 4) + 1))
    ins, attrs = [v.name], {"axis": _neg_axis(b, axis, v.rank)}
    if b.chance(0.4):  # uneven sizes given as the split input
        cuts = sorted(int(c) for c in b.rng.choice(np.arange(1, d), n - 1, replace=False))
        sizes = [y - x for x, y in zip([0, *cuts], [*cuts, d])]
        ins.append(b.ints(sizes))
    elif b.opset >= 18:
        attrs["num_outputs"] = n  # the last chunk is smaller when d % n != 0
        sizes = [-(-d // n)] * (n - 1)
        sizes.append(d - sum(sizes))
        if sizes[-1] <= 0:
            return False
    else:
        if d % n:
            return False
        sizes = [d // n] * n
    outs = [Val(b.fresh("v"), tuple(s if i == axis else x for i, x in enumerate(v.shape)), v.dtype, v.lo, v.hi, v.exact)
            for s in sizes]
    b.add("Split", ins, outs=outs, **attrs)
    return True


def gen_pad(b: Builder) -> bool:
    v = b.pick(lambda v: v.rank >= 1)
    if v is None:
        return False
    mode = b.choice(["constant", "constant", "reflect", "edge"])
    axes = list(range(v.rank))
    if b.opset >= 18 and b.chance(0.4):
        axes = sorted(int(a) for a in b.rng.choice(v.rank, int(b.rng.integers(1, v.rank + 1)), replace=False))
    pb, pe, shape = [], [], list(v.shape)
    for a in axes:
        d = v.shape[a]
        lim = 2 if mode != "reflect" else min(2, dim_range(d)[0] - 1)
        x, y = (int(b.rng.integers(0, lim + 1)) if b.chance(0.6) else 0 for _ in range(2))
        if mode == "constant" and _static(d) and d >= 3 and b.chance(0.1):
            x = -1  # negative pads crop
        pb.append(x)
        pe.append(y)
        shape[a] = dim_add(d, x + y)
    if b.too_big(tuple(shape)):
        return False
    ins = [v.name, b.ints(pb + pe)]
    lo, hi = v.lo, v.hi
    if mode == "constant" and b.chance(0.5):
        c = float(np.round(b.rng.uniform(-1, 1), 2))
        ins.append(b.scalar(c))
        lo, hi = min(lo, c), max(hi, c)
    elif mode == "constant":
        lo, hi = min(lo, 0.0), max(hi, 0.0)
    if len(axes) != v.rank:
        ins += [""] * (3 - len(ins)) + [b.ints([_neg_axis(b, a, v.rank) for a in axes])]
    b.add("Pad", ins, tuple(shape), lo=lo, hi=hi, exact=v.exact, mode=mode)
    return True


def gen_resize(b: Builder) -> bool:
    v = b.pick(lambda v: v.rank == 4 and all(_static(d) for d in v.shape[1:]) and max(map(int, v.shape[2:])) <= 16)
    if v is None:
        return False
    mode = b.choice(["nearest", "linear"])
    ctm = b.choice(["half_pixel", "asymmetric", "align_corners"] + (["pytorch_half_pixel"] if mode == "linear" else []))
    attrs: dict[str, Any] = {"mode": mode, "coordinate_transformation_mode": ctm}
    if mode == "nearest":
        attrs["nearest_mode"] = b.choice(["round_prefer_floor", "floor", "ceil", "round_prefer_ceil"])
    sizes_ok = all(_static(d) for d in v.shape) or b.opset >= 18
    axes = [2, 3]
    if sizes_ok and b.chance(0.35):
        out = [int(b.rng.integers(1, 2 * int(d) + 1)) for d in v.shape[2:]]
        full = b.opset < 18 or all(_static(d) for d in v.shape) and b.chance(0.5)
        ins = [v.name, "", "", b.ints(list(v.shape[:2]) + out if full else out)]
    else:
        sc = [float(b.choice([2.0, 0.5, 1.5, 3.0, 1.0])) for _ in axes]
        out = [int(math.floor(int(d) * s)) for d, s in zip(v.shape[2:], sc)]
        full = b.opset < 18 or b.chance(0.5)
        ins = [v.name, "", b.const(np.array(([1.0, 1.0] if full else []) + sc, np.float32), "s")]
    if not full:
        attrs["axes"] = [_neg_axis(b, a, 4) for a in axes]
    if min(out) < 1 or (ctm == "align_corners" and min(out) < 2):
        return False
    shape = (v.shape[0], v.shape[1], *out)
    if b.too_big(shape):
        return False
    b.add("Resize", ins, shape, lo=v.lo, hi=v.hi, exact=v.exact and mode == "nearest", **attrs)
    return True
