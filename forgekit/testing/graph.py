"""The data model of the random ONNX graphs (:mod:`.graphgen`): dims, tracked values, the node builder.

Dims are ints or strings: a base symbol of :data:`SYMBOLS`, or an affine offset of one (``"W-2"``).  A
:class:`Val` tracks a value's shape, dtype, a conservative interval and whether it is *exact* (computed by
rounding-free ops only); :class:`Builder` appends nodes and initializers; :func:`feeds_for` makes inputs
for a model alone (also a shrunk one), at several sizes of its symbols.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

INT64_MAX, INT64_MIN, INT32_MAX = 9223372036854775807, -9223372036854775808, 2147483647
#: base symbol -> (min, max) of the values it takes
SYMBOLS: dict[str, tuple[int, int]] = {"N": (1, 8), "W": (8, 24)}
#: one environment per feed set of a dynamic graph (every symbol takes its min and max somewhere)
ENVS: list[dict[str, int]] = [{"N": 1, "W": 24}, {"N": 3, "W": 8}, {"N": 8, "W": 13}]
#: metadata key (model.metadata_props) describing inputs made by the shrinker: name -> {lo, hi, shapes}
INPUT_META = "forgekit.fuzz.inputs"
MAX_ELEMS = 6000  # largest tensor (at the symbols' max values) a generated op may produce
_DT = {"float32": TensorProto.FLOAT, "int32": TensorProto.INT32, "int64": TensorProto.INT64, "bool": TensorProto.BOOL}
_INF = math.inf

Dim = int | str


# ---------------------------------------------------------------------------------------------- dims
def sym_parse(d: str) -> tuple[str, int]:
    m = re.fullmatch(r"([A-Za-z_]\w*?)([+-]\d+)?", d)
    if not m:
        raise ValueError(f"not a symbolic dim: {d!r}")
    return m.group(1), int(m.group(2) or 0)


def dim_add(d: Dim, k: int) -> Dim:
    if isinstance(d, int):
        return d + k
    base, off = sym_parse(d)
    off += k
    return base if off == 0 else f"{base}{off:+d}"


def dim_range(d: Dim) -> tuple[int, int]:
    if isinstance(d, int):
        return d, d
    base, off = sym_parse(d)
    lo, hi = SYMBOLS.get(base, (1, 8))
    return lo + off, hi + off


def dim_value(d: Dim, env: dict[str, int]) -> int:
    if isinstance(d, int):
        return d
    base, off = sym_parse(d)
    return env.get(base, SYMBOLS.get(base, (1, 1))[0]) + off


def numel_max(shape: tuple[Dim, ...]) -> int:
    return math.prod(dim_range(d)[1] for d in shape)


def broadcast(a: tuple[Dim, ...], b: tuple[Dim, ...]) -> tuple[Dim, ...] | None:
    """Numpy broadcast valid for every symbol value (a symbolic dim only meets itself or 1)."""
    out: list[Dim] = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(reversed(out))


# ---------------------------------------------------------------------------------------------- builder
@dataclass
class Val:
    name: str
    shape: tuple[Dim, ...]
    dtype: str = "float32"
    lo: float = -_INF
    hi: float = _INF
    exact: bool = False  # computed without rounding from the inputs: safe to compare / cast
    terminal: bool = False  # never consumed (an empty slice): only a graph output

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def amax(self) -> float:
        return max(abs(self.lo), abs(self.hi))


class Builder:
    """Graph under construction; op generators call :meth:`const`, :meth:`add` and :meth:`pick`."""

    def __init__(self, rng: np.random.Generator, opset: int, dynamic: bool, huge_ends: bool = True) -> None:
        self.rng, self.opset, self.dynamic, self.huge_ends = rng, opset, dynamic, huge_ends
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[Val] = []
        self.vals: list[Val] = []
        self.used: set[str] = set()
        self.counter = 0

    # random helpers
    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def choice(self, seq: Any) -> Any:
        seq = list(seq)
        return seq[int(self.rng.integers(len(seq)))]

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def const(self, array: Any, prefix: str = "w") -> str:
        name = self.fresh(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def ints(self, values: Any, dtype: Any = np.int64) -> str:
        return self.const(np.asarray(values, dtype), "k")

    def scalar(self, value: float, shape: tuple[int, ...] = ()) -> str:
        return self.const(np.full(shape, value, np.float32), "s")

    def weight(self, shape: tuple[int, ...], fan_in: int, gain: float = 1.0) -> np.ndarray:
        return (self.rng.standard_normal(shape) * gain / math.sqrt(max(fan_in, 1))).astype(np.float32)

    def add(self, op: str, inputs: list[str], shape: tuple[Dim, ...] | None = None, dtype: str = "float32",
            lo: float = -_INF, hi: float = _INF, exact: bool = False, outs: list[Val] | None = None,
            keep: bool = True, **attrs: Any) -> Val:
        """Append a node; returns its (first) output, registered as a value unless ``keep`` is False."""
        outs = outs or [Val(self.fresh("v"), tuple(shape or ()), dtype, lo, hi, exact)]
        self.nodes.append(helper.make_node(op, inputs, [o.name for o in outs], name=self.fresh(op + "_"), **attrs))
        self.used.update(i for i in inputs if i)
        if keep:
            self.vals.extend(outs)
        return outs[0]

    def pick(self, ok: Callable[[Val], bool] = lambda v: True, dtype: str | None = "float32") -> Val | None:
        """A random value satisfying ``ok``, favouring recent and not yet consumed ones."""
        cands = [v for v in self.vals if (dtype is None or v.dtype == dtype) and not v.terminal and ok(v)]
        if not cands:
            return None
        w = np.array([1.0 + 3.0 * (c.name not in self.used) + 2.0 * i / len(cands) for i, c in enumerate(cands)])
        return cands[int(self.rng.choice(len(cands), p=w / w.sum()))]

    def too_big(self, shape: tuple[Dim, ...]) -> bool:
        return numel_max(shape) > MAX_ELEMS or any(dim_range(d)[0] < 1 for d in shape)


@dataclass
class GeneratedGraph:
    """A generated model and what is known about it."""

    seed: int
    model: onnx.ModelProto
    description: str
    op_types: list[str]
    #: symbol -> (min, max) for the symbolic dims of the inputs (empty for a static graph)
    dynamic_dims: dict[str, tuple[int, int]] = field(default_factory=dict)

    def feeds(self, count: int | None = None) -> list[dict[str, np.ndarray]]:
        """Input feeds: one per environment of :data:`ENVS` for a dynamic graph, two for a static one."""
        return feeds_for(self.model, count=count, seed=self.seed)

    @property
    def opset(self) -> int:
        return next(o.version for o in self.model.opset_import if o.domain in ("", "ai.onnx"))


# ---------------------------------------------------------------------------------------------- feeds
def _input_meta(model: onnx.ModelProto) -> dict[str, Any]:
    for prop in model.metadata_props:
        if prop.key == INPUT_META:
            return json.loads(prop.value)
    return {}


def feeds_for(model: onnx.ModelProto, count: int | None = None, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Deterministic feeds for ``model``'s inputs: float32 uniform in [-1, 1] (or the recorded range of an
    input cut out by the shrinker), one feed set per symbol environment (dynamic) or ``count`` (static: 2)."""
    meta = _input_meta(model)
    inits = {i.name for i in model.graph.initializer}
    inputs = [vi for vi in model.graph.input if vi.name not in inits]
    dynamic = any(d.dim_param or not d.HasField("dim_value") for vi in inputs for d in vi.type.tensor_type.shape.dim)
    n = count or (len(ENVS) if dynamic or any(m.get("shapes") and len(m["shapes"]) > 1 for m in meta.values()) else 2)
    rng = np.random.default_rng(seed + 7919)
    out = []
    for k in range(n):
        env = ENVS[k % len(ENVS)]
        feed = {}
        for vi in inputs:
            info = meta.get(vi.name, {})
            if info.get("shapes"):
                shape = info["shapes"][k % len(info["shapes"])]
            else:
                shape = [d.dim_value if d.HasField("dim_value") else dim_value(d.dim_param or "N", env)
                         for d in vi.type.tensor_type.shape.dim]
            dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
            lo, hi = info.get("lo", -1.0), info.get("hi", 1.0)
            if dtype == np.bool_:
                feed[vi.name] = rng.random(shape) < 0.5
            elif np.issubdtype(dtype, np.integer):
                feed[vi.name] = rng.integers(int(math.floor(lo)), int(math.floor(hi)) + 1, shape).astype(dtype)
            else:
                feed[vi.name] = rng.uniform(lo, hi, shape).astype(dtype)
        out.append(feed)
    return out


# ---------------------------------------------------------------------------------------------- helpers
def _iv(f: Callable[[float], float], lo: float, hi: float, extra: tuple[float, ...] = ()) -> tuple[float, float]:
    """Interval of ``f`` over [lo, hi] from its ends (and interior critical points ``extra``)."""
    with np.errstate(all="ignore"):
        pts = [float(f(np.float64(x))) for x in (lo, hi, *[e for e in extra if lo < e < hi])]
    pts = [p for p in pts if not math.isnan(p)]
    return (min(pts), max(pts)) if len(pts) >= 2 else (-_INF, _INF)


def _mul_iv(a: Val, lo: float, hi: float) -> tuple[float, float]:
    prods = [x * y for x in (a.lo, a.hi) for y in (lo, hi)]
    return (-_INF, _INF) if any(math.isnan(p) for p in prods) else (min(prods), max(prods))


def _static(d: Dim) -> bool:
    return isinstance(d, int)


def _prod_dim(dims: tuple[Dim, ...]) -> Dim | None:
    """Product of dims if it is an int or exactly one symbolic dim (times ones), else None."""
    syms = [d for d in dims if isinstance(d, str)]
    if not syms:
        return math.prod(dims)  # type: ignore[arg-type]
    return syms[0] if len(syms) == 1 and all(d == 1 for d in dims if isinstance(d, int)) else None


def _bounded(b: Builder, v: Val, m: float) -> Val:
    if v.amax <= m:
        return v
    return b.add("Clip", [v.name, b.scalar(-m), b.scalar(m)], v.shape, lo=max(v.lo, -m), hi=min(v.hi, m),
                 exact=v.exact)


def _positive(b: Builder, v: Val, eps: float) -> Val:
    if v.lo >= eps:
        return v
    a = v if v.lo >= 0 else b.add("Abs", [v.name], v.shape, lo=0.0, hi=v.amax, exact=v.exact)
    return b.add("Add", [a.name, b.scalar(eps)], v.shape, lo=a.lo + eps, hi=a.hi + eps)


def _axes_arg(b: Builder, node_inputs: list[str], attrs: dict, axes: list[int], as_input: bool) -> None:
    if as_input:
        node_inputs.append(b.ints(axes))
    else:
        attrs["axes"] = axes


def _neg_axis(b: Builder, axis: int, rank: int) -> int:
    return axis - rank if b.chance(0.4) else axis


def _const_like(b: Builder, a: Val, dtype: str) -> tuple[str, tuple[int, ...], float, float]:
    """A constant broadcastable against ``a`` (symbolic dims become 1, some dims 1, maybe lower rank)."""
    shape = [1 if isinstance(d, str) or b.chance(0.3) else d for d in a.shape]
    shape = shape[int(b.rng.integers(0, len(shape) + 1)):] if shape and b.chance(0.3) else shape
    if dtype == "float32":
        arr = (b.rng.standard_normal(shape) * 0.7).astype(np.float32)
    else:
        arr = b.rng.integers(-5, 6, shape).astype(dtype)
    return b.const(arr, "c"), tuple(shape), float(arr.min(initial=0)), float(arr.max(initial=0))


def _partner(b: Builder, a: Val, dtype: str, ok: Callable[[Val], bool] = lambda v: True) -> Val | None:
    return b.pick(lambda v: v is not a and broadcast(a.shape, v.shape) is not None and ok(v), dtype=dtype)
