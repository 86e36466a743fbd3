"""Conv padding <-> ``relax.nn.pad`` widths: the two spellings of the same border, in one place.

A conv's ``padding`` lists all spatial befores, then all afters (``[top, left, bottom, right]``); ``relax.nn.pad``
takes a ``(before, after)`` pair per axis of the data layout, batch and channel axes included. The importer
(integer convs with a zero point), the quantizer (uint8 convs that pad with their zero point) and the
canonicalizer (``Pad -> Conv`` folded into the conv) all convert between them.
"""

from __future__ import annotations

from typing import Sequence


def _spatial(layout: str) -> list[int]:
    return [i for i, c in enumerate(layout) if c not in "NC"]


def pad_widths(layout: str, padding: Sequence[int]) -> list[int]:
    """``relax.nn.pad`` widths of a conv's ``padding`` for its data ``layout`` (NCHW, NHWC, NCW ...)."""
    spatial = _spatial(layout)
    n = len(spatial)
    if len(padding) != 2 * n:
        raise ValueError(f"a {layout} conv takes {2 * n} paddings, got {list(padding)}")
    widths = [0] * (2 * len(layout))
    for k, axis in enumerate(spatial):
        widths[2 * axis:2 * axis + 2] = [int(padding[k]), int(padding[n + k])]
    return widths


def conv_padding(layout: str, widths: Sequence[int]) -> list[int] | None:
    """The conv ``padding`` that ``relax.nn.pad`` ``widths`` add on ``layout``'s spatial axes, or None where they
    also pad the batch or channel axis (no conv padding says that) or do not fit the layout."""
    if len(widths) != 2 * len(layout) or any(widths[2 * i] or widths[2 * i + 1]
                                             for i, c in enumerate(layout) if c in "NC"):
        return None
    spatial = _spatial(layout)
    return [int(widths[2 * d]) for d in spatial] + [int(widths[2 * d + 1]) for d in spatial]
