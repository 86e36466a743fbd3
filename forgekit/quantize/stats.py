"""Streaming per-tensor statistics collected during calibration.

Every quantizable tensor gets one :class:`TensorStats`: global min/max, the running average of the
per-sample absolute maxima (the ``average`` method, robust to a single outlier batch) and a histogram of
``|x|`` that is re-binned when a larger value arrives (the ``percentile`` and ``entropy`` methods), so
memory stays constant however many samples are fed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: histogram resolution; 2048 bins over [0, absmax] as TensorRT's entropy calibrator uses
BINS = 2048


def _merge(old: tuple[np.ndarray, np.ndarray] | None, lo: np.ndarray,
           hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (min, max) so far; a changed channel count (dynamic shapes) starts over."""
    if old is None or old[0].shape != lo.shape:
        return lo, hi
    return np.minimum(old[0], lo), np.maximum(old[1], hi)


@dataclass
class TensorStats:
    """Statistics of one tensor over all calibration samples seen so far."""

    min: float = float("inf")
    max: float = float("-inf")
    absmax_sum: float = 0.0
    count: int = 0
    hist_range: float = 0.0
    hist: np.ndarray = field(default_factory=lambda: np.zeros(BINS, np.float64))
    #: signed (min, max) per channel of the last axis (matmul inputs: the K channels SmoothQuant balances)
    #: / of axis 1 of 3-D and 4-D tensors (conv inputs: NCW, NCHW): the range of a smoothed tensor ``x / s``
    channel_range: tuple[np.ndarray, np.ndarray] | None = None
    axis1_range: tuple[np.ndarray, np.ndarray] | None = None
    #: mean per channel of the last axis / of axis 1 of 3-D and 4-D tensors: the expected value of the output
    #: error that weight rounding causes, ``(Wq - W) @ mean(x)``, which bias correction removes
    channel_mean: np.ndarray | None = None
    axis1_mean: np.ndarray | None = None

    def update(self, x: np.ndarray) -> None:
        """Add one observed value of the tensor."""
        x = np.asarray(x, np.float32)
        if x.size == 0:
            return
        lo, hi = float(x.min()), float(x.max())
        self.min, self.max = min(self.min, lo), max(self.max, hi)
        absmax = max(abs(lo), abs(hi))
        self.absmax_sum += absmax
        if x.ndim in (3, 4):  # the inputs of quantizable convs: conv1d's NCW as well as conv2d's NCHW
            others = (0, *range(2, x.ndim))
            self.axis1_range = _merge(self.axis1_range, x.min(axis=others), x.max(axis=others))
            self.axis1_mean = self._average(self.axis1_mean, x.mean(axis=others, dtype=np.float64))
        if x.ndim >= 2:
            flat = x.reshape(-1, x.shape[-1])
            self.channel_range = _merge(self.channel_range, flat.min(axis=0), flat.max(axis=0))
            self.channel_mean = self._average(self.channel_mean, flat.mean(axis=0, dtype=np.float64))
        self.count += 1
        if absmax > self.hist_range:
            self._rebin(absmax if self.hist_range == 0 else max(absmax, 2 * self.hist_range))
        if self.hist_range > 0:
            counts, _ = np.histogram(np.abs(x), bins=BINS, range=(0.0, self.hist_range))
            self.hist += counts

    def _average(self, old: np.ndarray | None, new: np.ndarray) -> np.ndarray:
        """Running mean over the samples seen (this one is sample ``count + 1``)."""
        if old is None or old.shape != new.shape:
            return new
        return old + (new - old) / (self.count + 1)

    def _rebin(self, new_range: float) -> None:
        """Spread the counts of the old bins over a wider range (each old bin lands in one new bin)."""
        if self.hist_range > 0 and self.hist.any():
            centers = (np.arange(BINS) + 0.5) * (self.hist_range / BINS)
            self.hist, _ = np.histogram(centers, bins=BINS, range=(0.0, new_range), weights=self.hist)
        self.hist_range = new_range

    @property
    def channel_absmax(self) -> np.ndarray | None:
        """max |x| per channel of the last axis."""
        return None if self.channel_range is None else np.maximum(-self.channel_range[0], self.channel_range[1])

    @property
    def axis1_absmax(self) -> np.ndarray | None:
        """max |x| per channel of axis 1 (3-D and 4-D tensors)."""
        return None if self.axis1_range is None else np.maximum(-self.axis1_range[0], self.axis1_range[1])

    @property
    def absmax(self) -> float:
        return max(abs(self.min), abs(self.max)) if self.count else 0.0

    @property
    def average_absmax(self) -> float:
        return self.absmax_sum / self.count if self.count else 0.0

    @property
    def non_negative(self) -> bool:
        return self.count > 0 and self.min >= 0.0

    def to_dict(self) -> dict[str, float]:
        return {"min": self.min, "max": self.max, "average_absmax": self.average_absmax, "samples": self.count}
