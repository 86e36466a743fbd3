"""Ranges of the dynamic dimensions an artifact serves (``--dynamic W=32..2048``), like TensorRT's
optimization profiles.

A dimension kept symbolic (``--input-shape x=1x3x48xW``) serves every size by default; a range bounds it.
The bounds live where TVM reads them, as the ``tir_var_lower_bound`` / ``tir_var_upper_bound`` attributes
of ``main``: Relax's memory planner then sizes its buffers for the largest input once, instead of
allocating per call.  The artifact's metadata records them (``model.dynamic``) and the runtime refuses a
size outside them with one line naming the bound.

A step (``--dynamic H=32..2048:32``) says the dimension only takes multiples of it, as detectors with
stride-32 feature pyramids need: the importer then writes ``H`` as ``32 * H_div32`` (see
:mod:`.strides`), so ``2 * ((H - 1) // 32 + 1)`` (an upsampled coarse map) and ``(H - 1) // 16 + 1`` (the
finer map it is added to) both become ``2 * H_div32`` and the addition has a known shape.  Without the
step they differ for most ``H`` and the model cannot be imported with ``H`` symbolic.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..passes import input_symbols
from .errors import PrepareError

LOWER, UPPER = "tir_var_lower_bound", "tir_var_upper_bound"
#: ``main`` attribute: dimension name -> step, for dimensions that only take multiples of a step
STEP = "forgekit_dim_step"
#: ``main`` attribute: the dimensions whose upper bound is the model's own (:func:`bound_by_slices`)
MODEL_MAX = "forgekit_dim_model_max"
_RANGE = re.compile(r"^\s*(\d+)?\s*\.\.\s*(\d+)?\s*(?::\s*(\d+)\s*)?$")


@dataclass(frozen=True)
class DimRange:
    """Bounds of one dynamic dimension (``max`` None: unbounded); ``step`` > 1: multiples of it only."""

    min: int = 1
    max: int | None = None
    step: int = 1
    #: the max is the model's own (a static axis it slices with the dimension: :func:`bound_by_slices`)
    model_max: bool = False

    def __post_init__(self) -> None:
        if self.min < 1 or (self.max is not None and self.max < self.min):
            raise PrepareError(f"A dynamic range must have 1 <= min <= max, got {self}.")
        if self.step < 1 or (self.max is not None and self.max < self.step):
            raise PrepareError(f"A dynamic range's step must be at least 1 and at most its max, got {self}.")

    def __str__(self) -> str:
        return f"{self.min}..{'' if self.max is None else self.max}" + (f":{self.step}" if self.step != 1 else "")

    def to_dict(self) -> dict[str, Any]:
        return {"min": self.min, "max": self.max, **({"step": self.step} if self.step > 1 else {}),
                **({"model_max": True} if self.model_max else {})}

    @property
    def quotient_bounds(self) -> tuple[int, int | None]:
        """Bounds of ``dim // step`` over the multiples of ``step`` in the range."""
        return -(-self.min // self.step), None if self.max is None else self.max // self.step


def quotient_name(name: str, step: int) -> str:
    """The symbol the importer writes a stepped dimension with: ``H`` = ``step * H_div{step}``."""
    return f"{name}_div{step}"


def parse_range(symbol: str, value: Any) -> DimRange:
    """``"32..2048"``, ``"..2048"``, ``"32..2048:32"`` (multiples of 32), ``(32, 2048)``, ``(32, 2048, 32)``,
    ``{"min": 32, "max": 2048, "step": 32}`` or an int (the maximum)."""
    try:
        if isinstance(value, DimRange):
            return value
        if isinstance(value, Mapping):
            return DimRange(int(value.get("min", 1)), None if value.get("max") is None else int(value["max"]),
                            int(value.get("step", 1)))
        if isinstance(value, (tuple, list)) and len(value) in (2, 3):
            return DimRange(int(value[0] or 1), None if value[1] is None else int(value[1]),
                            int(value[2]) if len(value) == 3 else 1)
        if isinstance(value, int) and not isinstance(value, bool):
            return DimRange(1, value)
        match = _RANGE.match(str(value))
        if match:
            low, high, step = match.groups()
            return DimRange(int(low or 1), None if high is None else int(high), int(step or 1))
    except (TypeError, ValueError):
        pass
    raise PrepareError(f"Dynamic range {symbol}={value!r} must look like {symbol}=32..2048 (min..max; either may be "
                       f"left out) or {symbol}=32..2048:32 (multiples of 32 only).")


def parse_ranges(ranges: Mapping[str, Any] | None) -> dict[str, DimRange]:
    return {str(k): parse_range(str(k), v) for k, v in (ranges or {}).items()}


def annotate(mod: Any, ranges: Mapping[str, DimRange]) -> Any:
    """``mod`` with the bounds of ``ranges`` on ``main``; a symbol that is not a dynamic dimension of the
    model is a one-line :class:`PrepareError`."""
    if not ranges:
        return mod
    main = mod["main"]
    known = input_symbols(main)
    for name in ranges:
        if name not in known:
            have = ", ".join(known) or "none: give --input-shape with a name for the dimension, e.g. x=1x3x48xW"
            raise PrepareError(f"'{name}' is not a dynamic dimension of this model (its dynamic dimensions: {have}).")
    lower = {**_bounds(main, LOWER), **{k: r.min for k, r in ranges.items()}}
    upper = {**_bounds(main, UPPER), **{k: r.max for k, r in ranges.items() if r.max is not None}}
    steps = {k: r.step for k, r in ranges.items() if r.step > 1}
    for name, step in steps.items():  # the symbol the importer wrote the dimension with (see .strides)
        low, high = ranges[name].quotient_bounds
        lower[quotient_name(name, step)] = low
        if high is not None:
            upper[quotient_name(name, step)] = high
    for name, value in upper.items():
        if name not in ranges and value < lower.get(name, 1):
            raise PrepareError(f"Dynamic range of '{name}' is empty.")
    main = main.with_attr(LOWER, lower)
    if upper:
        main = main.with_attr(UPPER, upper)
    if steps:
        main = main.with_attr(STEP, steps)
    mod = mod.clone() if hasattr(mod, "clone") else mod
    mod["main"] = main
    return mod


def bound_by_slices(mod: Any) -> Any:
    """``mod`` whose dynamic dimensions are bounded by the static axes they slice in range.

    A slice bound read off an input's size that cannot be related to the axis it cuts (``table[:, :L]`` of a
    512-row position table) keeps TVM's slice, which takes the bound as in range
    (:func:`forgekit.passes.slices.exact_strided_slice`).  At ``L = 600`` that read 88 rows past the table and
    returned them (NaN, exit 0) where onnxruntime refuses the input ("Attempting to broadcast an axis by a
    dimension other than 1. 512 by 600").  So ``L`` gets the axis's size as its upper bound: the runtime refuses
    a larger ``L`` with one line, before any kernel runs, and the metadata says so (``model.dynamic``)."""
    from tvm import relax, tirx

    main = mod["main"]
    known = set(input_symbols(main))
    limits: dict[str, int] = {}

    def visit(expr: Any) -> None:
        if not (isinstance(expr, relax.Call) and getattr(expr.op, "name", None) == "relax.strided_slice"
                and bool(expr.attrs.assume_inbound)):
            return
        dims = getattr(getattr(expr.args[0].ty, "shape", None), "values", None)
        if dims is None:
            return
        axes, begins, ends = (list(getattr(a, "fields", a)) for a in expr.args[1:4])
        for axis, *bounds in zip(axes, begins, ends):
            size = dims[int(getattr(axis, "value", axis)) % len(dims)]
            if not isinstance(size, tirx.IntImm):
                continue
            for bound in bounds:
                bound = getattr(bound, "value", bound)
                if isinstance(bound, tirx.Mul) and isinstance(bound.b, tirx.IntImm) and int(bound.b) == -1:
                    bound = bound.a  # -L counts from the end: in range while L <= size
                if isinstance(bound, tirx.Var) and bound.name in known:
                    limits[bound.name] = min(limits.get(bound.name, int(size)), int(size))

    relax.analysis.post_order_visit(main, visit)
    upper = _bounds(main, UPPER)
    tighter = {k: v for k, v in limits.items() if upper.get(k) is None or v < upper[k]}
    if not tighter:
        return mod
    for name, value in tighter.items():
        if value < _bounds(main, LOWER).get(name, 1):
            raise PrepareError(f"Dynamic range of '{name}' is empty: the model slices {value} rows with it.")
    mod = mod.clone() if hasattr(mod, "clone") else mod
    mod["main"] = main.with_attr(UPPER, {**upper, **tighter}).with_attr(MODEL_MAX, {k: 1 for k in tighter})
    return mod


def _bounds(func: Any, key: str) -> dict[str, int]:
    attrs = func.attrs
    if attrs is None or key not in attrs:
        return {}
    return {str(k): int(v) for k, v in attrs[key].items()}


def ranges_of(mod: Any) -> dict[str, DimRange]:
    """Every dynamic dimension of ``mod``'s ``main`` with its bounds (1.. when none were given)."""
    main = mod["main"]
    lower, upper, steps = _bounds(main, LOWER), _bounds(main, UPPER), _bounds(main, STEP)
    own = _bounds(main, MODEL_MAX)
    return {name: DimRange(lower.get(name, 1), upper.get(name), steps.get(name, 1), name in own)
            for name in input_symbols(main)}
