"""Advice for an import that failed while input dimensions were still symbolic, checked before it is given.

Telling a user to pin every symbolic dimension to 1 (what forgekit used to say) is wrong for most models
that need it: a detector cannot run on a 1x1 image, an audio model's Reshape to ``[1, -5, -1]`` fails on one
frame.  Each candidate below is tried with a real import, and the first that imports is the advice; if none
does, the message says so instead of guessing.  The candidates, in order:

1. spatial dimensions of image inputs (axes 2 and 3 of a rank-4 input) kept dynamic in multiples of 32
   (``--dynamic H=32..2048:32``): what detectors with feature pyramids need (see :mod:`.strides`);
2. one symbol pinned, every other one kept dynamic (with a range to bound it): a seq2seq model whose
   target length must be fixed still serves every source length, an image pyramid every size;
3. every symbolic dimension pinned: 1 where it leads an input (a batch), 64 elsewhere (a multiple of 32,
   and enough frames or tokens for the pooling and convolution stacks seen in the corpus).

A fix found this way means the model cannot import with those dimensions dynamic (not that an operator is
unsupported): :func:`checked_advice` says so (``fixed``), and the importer raises
:class:`~.errors.DynamicDimensionError` (exit 3) instead of exit 4.  A failed candidate costs one more
import (seconds); this only runs once an import has already failed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from ..description import TensorInfo
from ..errors import ForgekitError
from .errors import fmt_shape

#: the size tried for a symbolic dimension that does not lead an input
PIN_SIZE = 64


def _symbols(inputs: Sequence[TensorInfo]) -> dict[str, int]:
    """Every symbol of the inputs with the size to pin it to (1 if it leads any input)."""
    sizes: dict[str, int] = {}
    for info in inputs:
        for axis, dim in enumerate(info.shape):
            if not isinstance(dim, int):
                sizes[str(dim)] = 1 if axis == 0 or sizes.get(str(dim)) == 1 else PIN_SIZE
    return sizes


def _candidates(source: Any, inputs: Sequence[TensorInfo]) -> list[tuple[str, Any]]:
    from .dynamic import DimRange

    out = []
    spatial = list(dict.fromkeys(str(d) for i in inputs if len(i.shape) == 4 for d in i.shape[2:]
                                 if not isinstance(d, int)))
    if spatial and not any(getattr(source.dynamic.get(n), "step", 1) > 1 for n in spatial):
        stepped = {**source.dynamic, **{n: DimRange(32, 2048, 32) for n in spatial}}
        flags = " ".join(f"--dynamic {n}=32..2048:32" for n in spatial)
        python = ", ".join(f"{n!r}: '32..2048:32'" for n in spatial)
        text = f"keep {', '.join(spatial)} dynamic in multiples of 32 (CLI: {flags}; Python: dynamic={{{python}}})"
        out.append((text, dataclasses.replace(source, dynamic=stepped)))
    sizes = _symbols(inputs)
    if len(sizes) > 1:
        for symbol, size in sizes.items():
            out.append(_pin_one(source, inputs, symbol, size, [s for s in sizes if s != symbol]))
    pinned = {**source.shape_dict, **{i.name: [d if isinstance(d, int) else sizes[str(d)] for d in i.shape]
                                      for i in inputs if not all(isinstance(d, int) for d in i.shape)}}
    flags = " ".join(f"--input-shape {i.name}={'x'.join(str(d) for d in pinned[i.name])}"
                     for i in inputs if i.name in pinned and not all(isinstance(d, int) for d in i.shape))
    out.append((f"pin them to the sizes you deploy with, e.g. {flags}",
                dataclasses.replace(source, shape_dict=pinned, dynamic={})))
    return out


def _pin_one(source: Any, inputs: Sequence[TensorInfo], symbol: str, size: int, others: list[str]) -> tuple[str, Any]:
    """The candidate that pins ``symbol`` alone (to ``size``) and keeps ``others`` dynamic."""
    shapes = {i.name: [size if str(d) == symbol else d for d in i.shape] for i in inputs
              if any(str(d) == symbol for d in i.shape)}
    flags = " ".join(f"--input-shape {name}={'x'.join(str(d) for d in dims)}" for name, dims in shapes.items())
    kept = " ".join(f"--dynamic {o}={_range(source, o)}" for o in others)
    text = f"pin {symbol} to the size you deploy with, e.g. {flags}, and keep {', '.join(others)} dynamic ({kept})"
    return text, dataclasses.replace(source, shape_dict={**source.shape_dict, **shapes},
                                     dynamic={k: v for k, v in source.dynamic.items() if k != symbol})


def _range(source: Any, symbol: str) -> str:
    """The range flag's value for ``symbol``: the one given, else an example to adjust."""
    given = source.dynamic.get(symbol)
    if given is None:
        return "1..2048"
    return f"{given.min}..{given.max if given.max is not None else ''}" + (f":{given.step}" if given.step > 1 else "")


def checked_advice(source: Any, inputs: Sequence[TensorInfo], try_import: Callable[[Any], Any]) -> tuple[str | None, bool]:
    """The first candidate fix that ``try_import`` (the importer, without advice) accepts, as a hint, and
    whether one was found (``(None, False)``: no input is dynamic)."""
    dynamic = [i for i in inputs if not all(isinstance(d, int) for d in i.shape)]
    if not dynamic:
        return None, False
    listing = ", ".join(f"{i.name}{fmt_shape(i.shape)}" for i in dynamic)
    for text, candidate in _candidates(source, inputs):
        try:
            try_import(candidate)
        except ForgekitError:
            continue
        return f"inputs {listing} are dynamic: {text} (checked: the model imports that way)", True
    return (f"inputs {listing} are dynamic and pinning them to 1 or {PIN_SIZE} does not help either: pin them to "
            "the sizes you deploy with (--input-shape), or re-export the model with static input shapes, or "
            "open an issue with the model"), False
