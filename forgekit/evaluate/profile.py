"""Per-kernel profile of an artifact: which fused kernels take the time, how often they run, and their
GFLOP/s, measured on the artifact itself (``forgekit bench --profile``).

The VM calls every kernel through one instruction; :meth:`forgekit.runtime.Engine.set_instrument` hooks
it, so the numbers are the compiled artifact's, not a re-build's.  The hook is a Python call around
each kernel (about 2 us each), so the sum of kernel times is a little below the instrumented wall time;
shares are what to read.  FLOPs come from the compile (``compile_report.json``, written with
``--export-metadata``): TVM's estimate for each kernel of static shape.  This is how PP-OCRv4 det's two
transposed convolutions (22 %) and 36 layout transposes (~20 %) were found.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..artifact.layout import REPORT_FILE


@dataclass
class KernelTime:
    """One kernel's share of a profiled run (times per inference)."""

    name: str
    calls: int
    ms: float
    share: float
    gflops: float | None = None  # GFLOP/s, when the compile report has the kernel's FLOPs
    rule: str | None = None  # forgekit's schedule rule that scheduled it, from the compile report

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def profile_engine(engine: Any, inputs: Sequence[Any], runs: int = 10, warmup: int = 2,
                   report_dir: str | Path | None = None) -> list[KernelTime]:
    """Time every kernel ``engine`` runs on ``inputs`` over ``runs`` inferences, heaviest first."""
    for _ in range(warmup):
        engine.infer(*inputs)
    totals: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    started: list[float] = []

    def hook(_func: Any, symbol: str, before: bool, _result: Any, *_args: Any) -> int:
        if before:
            started.append(time.perf_counter())
        else:
            totals[symbol] += time.perf_counter() - started.pop()
            calls[symbol] += 1
        return 0  # VMInstrumentReturnKind.NO_OP: run the call as usual

    engine.set_instrument(hook)
    try:
        for _ in range(runs):
            engine.infer(*inputs)
    finally:
        engine.set_instrument(None)
    flops, rules = _compile_report(report_dir, getattr(engine, "level", None))
    whole = sum(totals.values()) or 1.0
    rows = []
    for name, seconds in totals.items():
        ms = seconds / runs * 1e3
        per_call = seconds / calls[name]
        gflops = flops[name] / per_call / 1e9 if name in flops and per_call > 0 else None
        rows.append(KernelTime(name, calls[name] // runs, ms, seconds / whole, gflops, rules.get(name)))
    return sorted(rows, key=lambda r: -r.ms)


def _compile_report(directory: str | Path | None, level: str | None = None) -> tuple[dict[str, float], dict[str, str]]:
    """Kernel -> FLOPs per call and kernel -> schedule rule, from the compile report: of ``level`` (the one a
    portable artifact loaded here) where the report lists levels apart (``levels``), else its top level (the
    first, best level)."""
    path = Path(directory) / REPORT_FILE if directory is not None else None
    if path is None or not path.is_file():
        return {}, {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}, {}
    # the levels are different kernels: an int8 model's VNNI level runs fused_conv2d_int8_* kernels, its
    # x86-64-v3 level fused_conv2d_* ones, which the first level's entries leave blank
    data = (data.get("levels") or {}).get(level) or data if level else data
    return dict(data.get("kernel_flops") or {}), dict(data.get("schedule_rules") or {})


def table(rows: list[KernelTime], top: int = 15) -> str:
    """The heaviest ``top`` kernels as aligned text lines (ms per inference, share, GFLOP/s, rule)."""
    lines = [f"{'kernel':48s} {'calls':>5s} {'ms/run':>8s} {'share':>6s} {'GFLOP/s':>8s}  rule"]
    for row in rows[:top]:
        gf = f"{row.gflops:8.1f}" if row.gflops is not None else f"{'-':>8s}"
        lines.append(f"{row.name[:48]:48s} {row.calls:5d} {row.ms:8.3f} {row.share * 100:5.1f}% {gf}  {row.rule or '-'}")
    if len(rows) > top:
        rest = rows[top:]
        lines.append(f"{f'... {len(rest)} more':48s} {'':5s} {sum(r.ms for r in rest):8.3f} "
                     f"{sum(r.share for r in rest) * 100:5.1f}%")
    return "\n".join(lines)
