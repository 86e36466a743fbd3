"""Calibration methods: tensor statistics -> the clipping threshold ``T`` of a symmetric range [-T, T].

:data:`CALIB_METHODS` maps each method name to a function ``(stats, levels, options) -> T`` where
``levels`` is the number of positive quantization levels (127 for int8, 255 for non-negative uint8).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import UsageError
from .stats import BINS, TensorStats


def _minmax(stats: TensorStats, _levels: int, _opts: dict[str, Any]) -> float:
    return stats.absmax


def _average(stats: TensorStats, _levels: int, _opts: dict[str, Any]) -> float:
    return stats.average_absmax


def _percentile(stats: TensorStats, _levels: int, opts: dict[str, Any]) -> float:
    """The ``percentile`` (99 by default) of |x| over every calibration value."""
    pct = float(opts.get("percentile", 99.0))
    total = stats.hist.sum()
    if total == 0:
        return stats.absmax
    cdf = np.cumsum(stats.hist) / total
    idx = int(np.searchsorted(cdf, pct / 100.0))
    return min(stats.absmax, (idx + 1) * stats.hist_range / BINS)


def _entropy(stats: TensorStats, levels: int, _opts: dict[str, Any]) -> float:
    """TensorRT's KL-divergence calibration: the threshold whose ``levels``-bin quantized histogram
    loses the least information relative to the full one (outliers clipped into the last bin)."""
    hist = stats.hist
    if hist.sum() == 0:
        return stats.absmax
    best_kl, best_i = np.inf, BINS
    nonzero_tail = np.cumsum(hist[::-1])[::-1]
    for i in range(levels, BINS + 1, 16):
        p = hist[:i].astype(np.float64).copy()
        if i < BINS:
            p[-1] += nonzero_tail[i]
        # merge i bins into `levels` bins, then expand back over the non-empty source bins
        chunks = np.array_split(np.arange(i), levels)
        q = np.zeros(i)
        src = hist[:i]
        for c in chunks:
            nz = src[c] > 0
            if nz.any():
                q[c[nz]] = src[c].sum() / nz.sum()
        mask = p > 0
        if not mask.any():
            continue
        pn, qn = p / p.sum(), q / max(q.sum(), 1e-12)
        qn = np.where(mask & (qn == 0), 1e-12, qn)
        kl = float(np.sum(pn[mask] * np.log(pn[mask] / qn[mask])))
        if kl < best_kl:
            best_kl, best_i = kl, i
    return min(stats.absmax, best_i * stats.hist_range / BINS)


CALIB_METHODS: dict[str, Callable[[TensorStats, int, dict[str, Any]], float]] = {
    "average": _average,
    "entropy": _entropy,
    "minmax": _minmax,
    "percentile": _percentile,
}


def threshold(method: str, stats: TensorStats, levels: int, options: dict[str, Any] | None = None) -> float:
    """Clipping threshold of ``stats`` by ``method`` (a key of :data:`CALIB_METHODS`)."""
    try:
        fn = CALIB_METHODS[method]
    except KeyError:
        raise UsageError(f"Unknown calibration method '{method}': use one of {', '.join(CALIB_METHODS)}.") from None
    value = float(fn(stats, levels, options or {}))
    return value if value > 0 else 1e-8
