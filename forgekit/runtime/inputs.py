"""Example inputs made from an artifact's metadata alone (so they can be made for an artifact this machine
cannot load), and the checks a user's inputs pass before they reach a kernel."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import InputError


def example_size(span: Mapping[str, Any] | None) -> int:
    """The size example inputs give a symbolic dimension: 1 when the artifact serves it (no range, or one
    from 1, on its step); otherwise the geometric middle of the range's ends, on its step (``--dynamic
    H=32..640:32``: 128).  Not the smallest size: a model's own arithmetic may break there (NudeNet 320n cannot
    run 32x32, in onnxruntime either)."""
    if not span:
        return 1
    low = int(span.get("min") or 1)
    high = int(span.get("max") or low)  # no upper end: its smallest size
    step = int(span.get("step") or 1)
    first = -(-low // step) * step  # the smallest multiple of the step in the range
    if first == 1:
        return 1
    middle = round((low * high) ** 0.5 / step) * step
    return max(first, min(middle, high // step * step))


def example_inputs(specs: Sequence[Mapping[str, Any]], random: bool = True, seed: int = 0,
                   sizes: Mapping[str, int] | None = None,
                   ranges: Mapping[str, Mapping[str, Any]] | None = None) -> list[np.ndarray]:
    """Inputs for metadata tensor specs (``{"name", "shape", "dtype"}``): random or zeros.  Random values lie
    in the spec's ``values`` when it has them (see :func:`draw`), else floats in [0, 1), 0/1 for masks and
    booleans, integers in [0, 10).  Symbolic dims take their value from ``sizes`` (symbol -> int), else
    :func:`example_size` of their ``ranges`` entry (metadata ``model.dynamic``)."""
    rng = np.random.default_rng(seed)
    sizes = sizes or {}
    ranges = ranges or {}
    out = []
    for spec in specs:
        shape = tuple(d if isinstance(d, int) else int(sizes.get(str(d), example_size(ranges.get(str(d)))))
                      for d in spec["shape"])
        dtype = np.dtype(spec["dtype"])
        if not random:
            out.append(np.zeros(shape, dtype))
        elif spec.get("values"):
            out.append(draw(rng, shape, dtype, spec["values"]))
        elif dtype.kind == "f":
            out.append(rng.random(shape, dtype=np.float32).astype(dtype))
        elif dtype.kind == "b" or "mask" in spec["name"].lower():  # attention masks are 0/1
            out.append(rng.integers(0, 2, shape).astype(dtype))
        else:
            out.append(rng.integers(0, 10, shape).astype(dtype))
    return out


def draw(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype, values: Mapping[str, float]) -> np.ndarray:
    """Random values an input is meant to take (metadata ``values``): integers in ``[min, max]`` (the rows of
    the table an index reads), floats around the ``mean`` with the ``std`` of the calibration samples, kept in
    their ``[min, max]`` (uniform in it without moments)."""
    low, high = float(values["min"]), float(values["max"])
    if dtype.kind in "iu":
        return rng.integers(int(low), int(high) + 1, shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    if "mean" in values and "std" in values:
        drawn = rng.normal(float(values["mean"]), float(values["std"]), shape)
    else:
        drawn = rng.uniform(low, high, shape)
    return np.clip(drawn, low, high).astype(dtype)


def check_indices(specs: Sequence[Mapping[str, Any]], arrays: Sequence[np.ndarray]) -> None:
    """A one-line :class:`InputError` for an integer input holding a value outside the ``values`` its metadata
    records (the rows of the table it indexes): otherwise a kernel reads past the table, or onnxruntime
    refuses the feeds with a question about the model."""
    for spec, array in zip(specs, arrays):
        values = spec.get("values")
        if not values or np.asarray(array).dtype.kind not in "iu" or not np.asarray(array).size:
            continue
        low, high = int(values["min"]), int(values["max"])
        outside = np.asarray(array)[(array < low) | (array > high)]
        if outside.size:
            raise InputError(f"Input '{spec['name']}' holds {outside.flat[0]}; it indexes a table of {high + 1} rows "
                             f"in this model: pass values from {low} to {high}.")


def arrange_inputs(names: Sequence[str], given: Mapping[str, Any] | Sequence[Any]) -> list[Any]:
    """User inputs in the model's input order: ``given`` by name (each of ``names`` once, no other) or as a
    list already in order; one-line :class:`InputError` s name what is unknown or missing."""
    if not isinstance(given, Mapping):
        return list(given)
    unknown = [n for n in given if names and n not in names]
    if unknown:
        raise InputError(f"The model has no input named {', '.join(repr(n) for n in unknown)}; its inputs are: "
                         f"{', '.join(names)}.")
    missing = [n for n in names if n not in given]
    if missing:
        raise InputError(f"No value for input(s) {', '.join(repr(n) for n in missing)} (the model's inputs are: "
                         f"{', '.join(names)}).")
    return [given[n] for n in names] if names else list(given.values())


def user_inputs(specs: Sequence[Mapping[str, Any]], given: Mapping[str, Any] | Sequence[Any],
                ranges: Mapping[str, Mapping[str, Any]] | None = None) -> list[np.ndarray]:
    """A caller's inputs (by name, or a list in input order; ``verify``/``bench --input``) in input order,
    checked against the metadata specs: shapes, dtypes (:func:`check_inputs`) and indices inside their
    tables (:func:`check_indices`)."""
    arrays = check_inputs(specs, arrange_inputs([s["name"] for s in specs], given), ranges)
    check_indices(specs, arrays)
    return arrays


def fmt_shape(shape: Sequence[Any]) -> str:
    return "x".join(str(d) for d in shape) or "scalar"


def check_inputs(specs: Sequence[Mapping[str, Any]], arrays: Sequence[Any],
                 ranges: Mapping[str, Mapping[str, Any]] | None = None) -> list[np.ndarray]:
    """``arrays`` as numpy arrays after checking count, dtype, rank and every static dimension against
    ``specs``; a symbolic dimension must have the same value wherever its symbol appears, within its
    ``ranges`` entry (``{"W": {"min": 32, "max": 2048}}``, metadata ``model.dynamic``) and a multiple of its
    ``step`` if it has one.  One-line
    :class:`InputError` s name the input, what it got and what the model expects."""
    names = [s["name"] for s in specs]
    if len(arrays) != len(specs):
        raise InputError(f"The model takes {len(specs)} input(s) ({', '.join(names)}), got {len(arrays)}.")
    bound: dict[str, tuple[int, str]] = {}
    out = []
    for spec, array in zip(specs, arrays):
        array = np.asarray(array)
        name, shape, dtype = spec["name"], spec["shape"], spec["dtype"]
        if str(array.dtype) != dtype:
            raise InputError(f"Input '{name}' has dtype {array.dtype}; the model expects {dtype}.")
        if array.ndim != len(shape):
            raise InputError(f"Input '{name}' has shape {fmt_shape(array.shape)} ({array.ndim} dimensions); the "
                             f"model expects {fmt_shape(shape)} ({len(shape)} dimensions).")
        for axis, (want, got) in enumerate(zip(shape, array.shape)):
            if isinstance(want, int):
                if want != got:
                    raise InputError(f"Input '{name}' has shape {fmt_shape(array.shape)}; the model expects "
                                     f"{fmt_shape(shape)} (dimension {axis} must be {want}).")
                continue
            if got < 1:
                raise InputError(f"Input '{name}' dimension {axis} ('{want}') is {got}: it must be at least 1.")
            bounds = (ranges or {}).get(str(want)) or {}
            low, high = bounds.get("min") or 1, bounds.get("max")
            if high is not None and got > high and bounds.get("model_max"):
                raise InputError(f"Input '{name}' has {want}={got} (dimension {axis}); this model serves {want} up to "
                                 f"{high}: it cuts an axis of {high} with {want} (a position table, a mask).")
            if got < low or (high is not None and got > high):
                raise InputError(f"Input '{name}' has {want}={got} (dimension {axis}); this artifact serves {want} "
                                 f"from {low} to {high if high is not None else 'any size'}: recompile with "
                                 f"--dynamic {want}={min(low, got)}..{max(high or got, got)} to serve it.")
            step = bounds.get("step") or 1
            if got % step:
                up = -(-got // step) * step
                raise InputError(f"Input '{name}' has {want}={got} (dimension {axis}); this artifact serves {want} in "
                                 f"multiples of {step} only: pad the input to {want}={up}.")
            seen = bound.setdefault(str(want), (got, name))
            if seen[0] != got:
                raise InputError(f"Input '{name}' has {want}={got} but input '{seen[1]}' has {want}={seen[0]}: "
                                 "dimensions with the same name must agree.")
        out.append(array)
    return out
