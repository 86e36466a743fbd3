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


@dataclass
class TensorStats:
    """Statistics of one tensor over all calibration samples seen so far."""

    min: float = float("inf")
    max: float = float("-inf")
    absmax_sum: float = 0.0
    count: int = 0
    hist_range: float = 0.0
    hist: np.ndarray = field(default_factory=lambda: np.zeros(BINS, np.float64))
    #: max |x| per channel of the last axis (matmul inputs: the K channels SmoothQuant balances)
    channel_absmax: np.ndarray | None = None
    #: max |x| per channel of axis 1 of 4-D tensors (conv inputs in NCHW)
    axis1_absmax: np.ndarray | None = None

    def update(self, x: np.ndarray) -> None:
        """Add one observed value of the tensor."""
        x = np.asarray(x, np.float32)
        if x.size == 0:
            return
        lo, hi = float(x.min()), float(x.max())
        self.min, self.max = min(self.min, lo), max(self.max, hi)
        absmax = max(abs(lo), abs(hi))
        self.absmax_sum += absmax
        if x.ndim == 4:
            c1 = np.abs(x).max(axis=(0, 2, 3))
            same = self.axis1_absmax is not None and self.axis1_absmax.shape == c1.shape
            self.axis1_absmax = np.maximum(self.axis1_absmax, c1) if same else c1
        if x.ndim >= 2:
            per_channel = np.abs(x.reshape(-1, x.shape[-1])).max(axis=0)
            if self.channel_absmax is None or self.channel_absmax.shape != per_channel.shape:
                self.channel_absmax = per_channel
            else:
                self.channel_absmax = np.maximum(self.channel_absmax, per_channel)
        self.count += 1
        if absmax > self.hist_range:
            self._rebin(absmax if self.hist_range == 0 else max(absmax, 2 * self.hist_range))
        if self.hist_range > 0:
            counts, _ = np.histogram(np.abs(x), bins=BINS, range=(0.0, self.hist_range))
            self.hist += counts

    def _rebin(self, new_range: float) -> None:
        """Spread the counts of the old bins over a wider range (each old bin lands in one new bin)."""
        if self.hist_range > 0 and self.hist.any():
            centers = (np.arange(BINS) + 0.5) * (self.hist_range / BINS)
            self.hist, _ = np.histogram(centers, bins=BINS, range=(0.0, new_range), weights=self.hist)
        self.hist_range = new_range

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
