"""Ranges of the dynamic dimensions an artifact serves (``--dynamic W=32..2048``), like TensorRT's
optimization profiles.

A dimension kept symbolic (``--input-shape x=1x3x48xW``) serves every size by default; a range bounds it.
The bounds live where TVM reads them, as the ``tir_var_lower_bound`` / ``tir_var_upper_bound`` attributes
of ``main``: Relax's memory planner then sizes its buffers for the largest input once, instead of
allocating per call.  The artifact's metadata records them (``model.dynamic``) and the runtime refuses a
size outside them with one line naming the bound.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..passes import input_symbols
from .errors import PrepareError

LOWER, UPPER = "tir_var_lower_bound", "tir_var_upper_bound"
_RANGE = re.compile(r"^\s*(\d+)?\s*\.\.\s*(\d+)?\s*$")


@dataclass(frozen=True)
class DimRange:
    """Bounds of one dynamic dimension (``max`` None: unbounded)."""

    min: int = 1
    max: int | None = None

    def __post_init__(self) -> None:
        if self.min < 1 or (self.max is not None and self.max < self.min):
            raise PrepareError(f"A dynamic range must have 1 <= min <= max, got {self}.")

    def __str__(self) -> str:
        return f"{self.min}..{'' if self.max is None else self.max}"

    def to_dict(self) -> dict[str, Any]:
        return {"min": self.min, "max": self.max}


def parse_range(symbol: str, value: Any) -> DimRange:
    """``"32..2048"``, ``"..2048"``, ``(32, 2048)``, ``{"min": 32, "max": 2048}`` or an int (the maximum)."""
    try:
        if isinstance(value, DimRange):
            return value
        if isinstance(value, Mapping):
            return DimRange(int(value.get("min", 1)), None if value.get("max") is None else int(value["max"]))
        if isinstance(value, (tuple, list)) and len(value) == 2:
            return DimRange(int(value[0] or 1), None if value[1] is None else int(value[1]))
        if isinstance(value, int) and not isinstance(value, bool):
            return DimRange(1, value)
        match = _RANGE.match(str(value))
        if match:
            low, high = match.groups()
            return DimRange(int(low or 1), None if high is None else int(high))
    except (TypeError, ValueError):
        pass
    raise PrepareError(f"Dynamic range {symbol}={value!r} must look like {symbol}=32..2048 (min..max; either may be "
                       "left out).")


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
    for name, value in upper.items():
        if name not in ranges and value < lower.get(name, 1):
            raise PrepareError(f"Dynamic range of '{name}' is empty.")
    main = main.with_attr(LOWER, lower)
    if upper:
        main = main.with_attr(UPPER, upper)
    mod = mod.clone() if hasattr(mod, "clone") else mod
    mod["main"] = main
    return mod


def _bounds(func: Any, key: str) -> dict[str, int]:
    attrs = func.attrs
    if attrs is None or key not in attrs:
        return {}
    return {str(k): int(v) for k, v in attrs[key].items()}


def ranges_of(mod: Any) -> dict[str, DimRange]:
    """Every dynamic dimension of ``mod``'s ``main`` with its bounds (1.. when none were given)."""
    main = mod["main"]
    lower, upper = _bounds(main, LOWER), _bounds(main, UPPER)
    return {name: DimRange(lower.get(name, 1), upper.get(name)) for name in input_symbols(main)}
