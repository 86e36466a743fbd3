"""Legalize a matmul of two activations whose rows, columns or reduction are symbolic (attention on a
dynamic sequence length: ``q @ k^T`` is [S, d] x [d, S], ``softmax @ v`` is [S, S] x [S, d]) so the
register-tiled matmul rule schedules it.

The rule tiles rows by ``rt`` and columns by ``vt`` vector lanes and needs both tile counts exact.  Here
the symbolic rows are rounded up to ``rt`` and read clamped (``A[min(m, M - 1)]``: a repeated valid row),
and the symbolic columns to ``vt`` from a zero-padded copy of ``B`` (a clamp there would turn every vector
load into a gather); the epilogue slices the extra rows and columns off.  The reduction may stay symbolic:
it is a serial loop.  Without this, attention at S=128 ran 30x slower than its static twin (generic
reduction fallback).  Static sizes get the same padding where the stock kernel would tile badly: columns
that are not whole vectors, rows without a good register tile (:func:`.tiling.padded_rows`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import tvm
import tvm_ffi
from tvm import te, tirx

from .tiling import choose_tiles, padded_rows, round_up, symbolic_vector_tile

if TYPE_CHECKING:
    from ...targets.isa import IsaInfo


def _static(v: Any) -> int | None:
    return int(v) if isinstance(v, tirx.IntImm) else None


def legalize_dynamic_matmul(bb: Any, call: Any, tinfo: IsaInfo) -> Any | None:
    """The legalized call, or None when this is not a float32 activation matmul with a symbolic row,
    column or reduction extent (or static ones the rule cannot tile well: :func:`_static_but_ragged`) and
    equal batch dimensions."""
    a, b = call.args
    if a.ty.shape is None or b.ty.shape is None or str(a.ty.dtype) != "float32" or str(b.ty.dtype) != "float32":
        return None
    if str(call.attrs.out_dtype) not in ("", "None", "void", "float32"):
        return None
    xs, ys = list(a.ty.shape.values), list(b.ty.shape.values)
    if len(xs) < 2 or len(xs) != len(ys) or not all(
            tvm_ffi.structural_equal(p, q) for p, q in zip(xs[:-2], ys[:-2])):
        return None
    m, k, n = xs[-2], xs[-1], ys[-1]
    if not tvm_ffi.structural_equal(k, ys[-2]):
        return None
    ns, ms = _static(n), _static(m)
    if all(_static(v) is not None for v in (m, k, n)):
        return _static_but_ragged(bb, a, b, (ms, int(k), ns), tinfo)
    vt = choose_tiles(ns, ms, tinfo)[0] if ns is not None else symbolic_vector_tile(tinfo)
    rt = choose_tiles(ns if ns is not None else vt, ms, tinfo)[1]
    if ns is not None and ns % vt:
        return None  # a static column count the rule cannot tile exactly: leave it to the stock kernel
    rows = (lambda m_: m_) if ms is not None else (lambda m_: round_up(m_, rt))  # noqa: E731
    cols = (lambda n_: n_) if ns is not None else (lambda n_: round_up(n_, vt))  # noqa: E731
    return bb.call_te(_padded_matmul(rows, cols, ms is None, ns is None), a, b, primfunc_name_hint="matmul")


def _static_but_ragged(bb: Any, a: Any, b: Any, mkn: tuple[int, int, int], tinfo: IsaInfo) -> Any | None:
    """A static activation matmul whose columns are not whole vectors or whose rows have no good register
    tile, padded like a symbolic one (None, the stock kernel, otherwise).  ViT's attention on 101 tokens (a
    prime): ``q @ k^T`` [101, 64] x [64, 101] ran one column at a time (4.8 GFLOP/s), ``softmax @ v``
    [101, 101] x [101, 64] in 1-row tiles (14 GFLOP/s)."""
    m, k, n = mkn
    lanes = tinfo.vec_lanes
    np_ = -(-n // lanes) * lanes if n % lanes and n > lanes else n
    mp = padded_rows(np_, m, tinfo)
    if (mp, np_) == (m, n) or np_ % choose_tiles(np_, mp, tinfo)[0]:
        return None
    return bb.call_te(_padded_matmul(lambda _: mp, lambda _: np_, mp != m, np_ != n), a, b,
                      primfunc_name_hint="matmul")


def _padded_matmul(rows: Any, cols: Any, clamp_rows: bool, pad_cols: bool) -> Any:
    """The TE function: ``rows(m)`` x ``cols(n)`` outputs (rows past ``m`` from a clamped row, columns past ``n``
    from zeros), sliced to ``m`` x ``n``.

    The sizes come from the placeholders ``x`` and ``y``, not from the Relax call: ``call_te`` binds the
    placeholders' symbolic dims, and a symbol of the call that reaches the kernel only through the reduction
    extent (a decoder's ``softmax @ v`` over the encoder's ``src_len``, which is neither a row nor a column)
    was an undefined variable in the generated kernel."""

    def f(x: Any, y: Any) -> Any:
        lead, m, k, n = list(x.shape[:-2]), x.shape[-2], x.shape[-1], y.shape[-1]
        mp, np_ = rows(m), cols(n)
        if pad_cols:
            y = te.compute((*lead, k, np_), lambda *i: tirx.if_then_else(
                i[-1] < n, y(*i[:-1], tirx.min(i[-1], n - 1)), tirx.const(0.0, "float32")), name="T_pad_cols")
        row = (lambda i: tirx.min(i, m - 1)) if clamp_rows else (lambda i: i)  # noqa: E731
        r = te.reduce_axis((0, k), "k")
        out = te.compute((*lead, mp, np_), lambda *i: te.sum(x(*i[:-2], row(i[-2]), r) * y(*i[:-2], r, i[-1]),
                                                            axis=[r]), name="matmul")
        if not clamp_rows and not pad_cols:
            return out
        return te.compute((*lead, m, n), lambda *i: out(*i), name="T_slice_n")
    return f
