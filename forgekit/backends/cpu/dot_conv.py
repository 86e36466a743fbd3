"""The dot-product convolution that the int8 (:mod:`.int8`) and bf16 (:mod:`.bf16`) legalizations both emit:
weights packed ``[OC/L, KH, KW, IC/R, L, R]`` (``L`` lanes of one instruction, ``R`` elements each lane
reduces: one 64-byte load per instruction), an input read through clamped indices, and the reduction that
:class:`.rules.dot_tile.DotTileRule` tensorizes."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import tvm
from tvm import te

from .tiling import choose_dot_tile, round_up, symbolic_factor


def ceil_to(a: int, b: int) -> int:
    """``a`` rounded up to a multiple of ``b`` (static sizes; :func:`.tiling.round_up` is the symbolic one)."""
    return (a + b - 1) // b * b


def pack_weights(w: np.ndarray, red: int, lanes: int) -> np.ndarray:
    """HWIO weights ``w`` (already in the kernel's element type) -> ``[OC/lanes, KH, KW, IC/red, lanes, red]``,
    channels zero-padded to multiples of ``red`` and ``lanes``."""
    kh, kw, ic, oc = w.shape
    icp, ocp = ceil_to(ic, red), ceil_to(oc, lanes)
    wpad = np.zeros((kh, kw, icp, ocp), w.dtype)
    wpad[:, :, :ic, :oc] = w
    return np.ascontiguousarray(wpad.reshape(kh, kw, icp // red, red, ocp // lanes, lanes).transpose(4, 0, 1, 2, 5, 3))


def output_width(ow: Any, nvec: int, budget: int) -> Any:
    """The output columns a dot-product conv computes for a symbolic output width ``ow`` (a static one is kept):
    ``ow`` rounded up to the row tile :class:`.rules.dot_tile.DotTileRule` will take for it, so every tile is
    whole (the extra columns repeat the last one's input, :func:`conv`'s ``width``).  A width already provably
    a multiple of 2, 4 or 8 (``--dynamic W=..:32``) is kept: such a tile divides it (see
    :func:`.tiling.symbolic_factor`).  Without rounding the rule could only take 1-column tiles, each weight
    load feeding one dot instruction."""
    if isinstance(ow, int):
        return ow
    factor = symbolic_factor(ow)
    if factor > 1:
        return ow
    _, rt = choose_dot_tile(nvec, None, budget, 8)
    return ow if rt == 1 else round_up(ow, rt)


def padded_reader(x: Any, h: int, wd: int, ic: int, top: int, left: int) -> Callable[..., tuple[Any, Any]]:
    """``(b, y, xx, c) -> (inside, value)`` on the padded input: whether the position lies inside ``x`` (NHWC,
    ``h x wd x ic``, padded by ``top``/``left`` before), and its element there.  The indices are clamped so
    TVM's region analysis keeps the read inside ``x``; the caller guards the value with ``inside``."""
    def read(b: Any, y: Any, xx: Any, c: Any) -> tuple[Any, Any]:
        inside = tvm.tirx.all(y >= top, y < top + h, xx >= left, xx < left + wd, c < ic)
        return inside, x[b, tvm.tirx.max(y - top, 0), tvm.tirx.max(xx - left, 0), tvm.tirx.min(c, ic - 1)]
    return read


def conv(xs: Any, wp: Any, out_shape: tuple, kernel: tuple[int, int], strides: tuple[int, int],
         dilation: tuple[int, int], red: int, lanes: int, load: Callable[[Any], Any], name: str,
         width: int | None = None) -> Any:
    """``out[b, y, x, f] = sum load(xs[b, y*sh + ry*dh, x*sw + rx*dw, c]) * load(wp[f/lanes, ry, rx, c/red,
    f%lanes, c%red])`` over ``ry, rx, c``, the channel axis split into ``c/red`` and the ``red`` elements one
    lane reduces (innermost, as the dot rules expect); ``xs`` holds the channels padded to ``red``.  With
    ``width`` (the real output width, below ``out_shape``'s) the extra columns repeat the last one's input."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilation
    col = (lambda xx: xx) if width is None else (lambda xx: tvm.tirx.min(xx, width - 1))  # noqa: E731
    icp = int(xs.shape[-1])
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")
    rc = te.reduce_axis((0, icp // red), "rc")
    ri = te.reduce_axis((0, red), "ri")
    return te.compute(
        out_shape,
        lambda b, y, xx, ff: te.sum(load(xs[b, y * sh + ry * dh, col(xx) * sw + rx * dw, rc * red + ri])
                                    * load(wp[ff // lanes, ry, rx, rc, ff % lanes, ri]), axis=[ry, rx, rc, ri]),
        name=name)
