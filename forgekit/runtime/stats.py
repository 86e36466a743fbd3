"""Latency statistics, computed one way for every timer (the runtime's ``benchmark``, ``forgekit bench``)."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence


def time_calls(run: Callable[[], Any], n: int, warmup: int = 1) -> list[float]:
    """Milliseconds of each of ``n`` calls of ``run`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def latency_stats(times_ms: Sequence[float]) -> dict[str, float]:
    """``runs``, ``median_ms``, ``p90_ms``, ``mean_ms``, ``min_ms`` and ``throughput_per_s`` of run times."""
    times = sorted(times_ms)
    n = len(times)
    median = statistics.median(times)
    return {"runs": n, "median_ms": median, "p90_ms": times[min(n - 1, int(round(0.9 * (n - 1))))],
            "mean_ms": statistics.fmean(times), "min_ms": times[0],
            "throughput_per_s": 1e3 / median if median > 0 else float("inf")}
