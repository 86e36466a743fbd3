"""Comparing an output with its reference, the way every forgekit check does:
``|actual - ref| <= atol * max|ref| + rtol * |ref|`` for floats (atol relative to the reference's largest
magnitude), exact equality for everything else."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: Defaults of ``tests/conftest.py::assert_close``: atol is relative to the reference's largest magnitude.
RTOL = 1e-3
ATOL = 1e-4


@dataclass
class OutputComparison:
    """How one output compares with onnxruntime's.

    ``max_rel`` is ``|actual - ref| / max(|ref|, tolerance)`` at its worst element: relative where the
    reference is not near zero, without dividing by the zeros a softmax or relu produces.
    """

    name: str
    shape: list[int]
    max_abs: float
    max_rel: float
    tolerance: float  # allowed absolute error where the reference is 0 (atol * max|ref|)
    mismatched: int  # elements outside the tolerance
    size: int
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.mismatched == 0 and not self.note

    def line(self) -> str:
        """One human line: name, shape, errors, verdict."""
        shape = "x".join(map(str, self.shape)) or "scalar"
        verdict = "ok" if self.ok else f"MISMATCH ({self.note or f'{self.mismatched}/{self.size} elements'})"
        return (f"{self.name}: {shape} max abs err {self.max_abs:.3e}, max rel err {self.max_rel:.3e} "
                f"(atol {self.tolerance:.1e}) {verdict}")


def compare(name: str, actual: np.ndarray, expected: np.ndarray, rtol: float = RTOL,
            atol: float = ATOL) -> OutputComparison:
    """Compare one output with its reference: floats within tolerance, everything else exactly."""
    expected, actual = np.asarray(expected), np.asarray(actual)
    if actual.shape != expected.shape:  # a wrong shape is a wrong answer, even with the right element count
        return OutputComparison(name, list(expected.shape), float("inf"), float("inf"), 0.0, expected.size,
                                expected.size, note=f"shape {list(actual.shape)}, expected {list(expected.shape)}")
    ref = expected.astype(np.float64)
    got = actual.astype(np.float64)
    floating = expected.dtype.kind in "fc"
    finite = np.abs(ref[np.isfinite(ref)])
    scale = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    tol = atol * scale if floating else 0.0
    close = np.isclose(got, ref, rtol=rtol if floating else 0.0, atol=tol, equal_nan=True)
    with np.errstate(invalid="ignore"):
        diff = np.where(close & np.isnan(ref), 0.0, np.abs(got - ref))
    diff = np.nan_to_num(diff, nan=np.inf)
    rel = diff / np.maximum(np.abs(ref), tol if tol > 0 else 1.0)
    return OutputComparison(name, list(expected.shape), float(diff.max(initial=0.0)), float(rel.max(initial=0.0)),
                            tol, int((~close).sum()), int(expected.size))


def compare_outputs(ours: list[Any], refs: list[Any], rtol: float, atol: float) -> dict[str, Any]:
    """The worst output's ``max_abs_error`` and ``output_scale``, and whether all outputs match."""
    checks = [compare(str(i), out, ref, rtol, atol) for i, (out, ref) in enumerate(zip(ours, refs))]
    worst = max(checks, key=lambda c: c.max_abs / max(c.tolerance / atol if atol else 1.0, 1e-30))
    return {"max_abs_error": worst.max_abs, "output_scale": worst.tolerance / atol if atol else None,
            "outputs_match": all(c.ok for c in checks) and len(ours) == len(refs)}
