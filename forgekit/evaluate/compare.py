"""Comparing an output with its reference, the way every forgekit check does:
``|actual - ref| <= atol * max|ref| + rtol * |ref|`` for floats (atol relative to the reference's largest
magnitude), exact equality for everything else.  An artifact that computes in less than fp32 (bf16/fp16
kernels, or quantized by forgekit from a float model) is judged against the float model by the cosine of
each float output instead (:func:`min_cosine_for`): elementwise tolerances made for fp32 would call a
correct bf16 ResNet-50 (cosine 0.99999, top-1 kept) wrong."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: Defaults of ``tests/conftest.py::assert_close``: atol is relative to the reference's largest magnitude.
RTOL = 1e-3
ATOL = 1e-4
#: Least cosine with the fp32 reference per output, by the artifact's arithmetic: bf16 keeps 8 bits of
#: mantissa (measured 0.99998-0.99999 on ResNet-18/50, MobileNetV2), fp16 10; int8 quantization of a float
#: model loses more: 0.99 is the bar tests/unit/test_quantize*.py hold forgekit's int8 models to.
MIN_COSINE = {"bfloat16": 0.999, "float16": 0.999, "quantized": 0.99}
#: An fp32 output also matches when no element is further from the reference than this many times the
#: reference's own noise floor (:func:`forgekit.evaluate.reference.noise_floor`): a wrong kernel is off by
#: far more than reassociation, a right one on an ill-conditioned output by about the same.  Judged by cosine
#: (reduced precision), an output also matches when its cosine deficit ``1 - cos`` is within this many times
#: the reference's own (:func:`forgekit.evaluate.reference.cosine_noise`).
NOISE_FACTOR = 4.0
#: Reference elements at least this large (or infinite) are mask values, not numbers: ``-FLT_MAX`` /
#: ``-1e30`` fills of masked attention scores or of suppressed boxes.
MASK_MIN = 1e30
#: Finite reference elements above a gap of this factor in the magnitudes, and at least :data:`MASK_GAP_MIN`,
#: are masks too (``scores - 1e9`` where a mask is 0): nothing a model computes sits alone that far up.
MASK_GAP = 1e4
MASK_GAP_MIN = 1e6


def min_cosine_for(model_meta: dict[str, Any]) -> float | None:
    """The cosine criterion for an artifact's ``metadata.json`` ``model`` section; None for fp32 artifacts
    (elementwise tolerances apply)."""
    if model_meta.get("quantization"):
        return MIN_COSINE["quantized"]
    return MIN_COSINE.get(str(model_meta.get("precision")))


def mask_of(ref: np.ndarray) -> np.ndarray:
    """The elements of a float reference that are mask values (see :data:`MASK_MIN`, :data:`MASK_GAP`).

    They are judged apart: a tolerance relative to the largest magnitude made one ``-FLT_MAX`` element turn
    ``atol`` into 3.4e34, under which any output passed; and a cosine over them only sees the masks."""
    magnitude = np.abs(ref)
    masked = ~np.isfinite(ref) | (magnitude >= MASK_MIN)
    values = np.unique(magnitude[~masked & (magnitude > 0)])
    if values.size > 1:
        gaps = values[1:] / values[:-1]
        above = np.nonzero((gaps >= MASK_GAP) & (values[1:] >= MASK_GAP_MIN))[0]
        if above.size:  # the lowest such gap: everything above it is masks (-1e9 and -2e9 alike)
            masked |= magnitude >= values[above[0] + 1]
    return masked


def masks_agree(got: np.ndarray, ref: np.ndarray, rtol: float) -> np.ndarray:
    """Per masked element: the output holds the same mask there (same sign, as far out: both at least
    :data:`MASK_MIN` or infinite, or within ``rtol`` of it); NaN masks match NaN."""
    with np.errstate(invalid="ignore", over="ignore"):
        same_side = np.sign(got) == np.sign(ref)
        both_out = (np.abs(got) >= MASK_MIN) & (np.abs(ref) >= MASK_MIN)
        near = np.abs(got - ref) <= rtol * np.abs(ref)
    return (same_side & (both_out | near)) | (np.isnan(got) & np.isnan(ref))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / norms) if norms > 0 else float(np.array_equal(a, b))


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
    cosine: float | None = None  # with the reference, when judged by cosine (reduced-precision artifacts)
    noise: float = 0.0  # the reference's own noise floor, when it was needed (reference.noise_floor)
    #: ``1 - cosine`` of the reference with itself (optimized vs unoptimized graph), when it was needed
    cosine_noise: float = 0.0
    #: ``1 - cosine`` of the reference with bf16-rounded operands (:mod:`.bf16_reference`), when it was needed
    bf16_noise: float = 0.0
    #: elements of the reference that are mask values (:func:`mask_of`), judged apart from the numbers
    masked: int = 0

    @property
    def ok(self) -> bool:
        return self.mismatched == 0 and not self.note

    def line(self) -> str:
        """One human line: name, shape, errors, verdict."""
        shape = "x".join(map(str, self.shape)) or "scalar"
        verdict = "ok" if self.ok else f"MISMATCH ({self.note or f'{self.mismatched}/{self.size} elements'})"
        if self.masked:  # what the errors are of: the numbers, the masks being judged apart
            verdict = f"({self.masked} masked element(s) judged apart) {verdict}"
        if self.cosine is not None:
            own = ""
            if self.bf16_noise > self.cosine_noise:
                own = f" (onnxruntime with bf16-rounded conv/matmul operands: cosine {1 - self.bf16_noise:.6f}; ill-conditioned)"
            elif self.cosine_noise >= 5e-7:  # below, it prints as 1.000000: nothing ill-conditioned to say
                own = f" (onnxruntime's own fp32 cosine {1 - self.cosine_noise:.6f}: ill-conditioned)"
            return f"{self.name}: {shape} cosine {self.cosine:.6f}{own}, max abs err {self.max_abs:.3e} {verdict}"
        noise = f", onnxruntime's own noise {self.noise:.1e}" if self.noise else ""
        return (f"{self.name}: {shape} max abs err {self.max_abs:.3e}, max rel err {self.max_rel:.3e} "
                f"(atol {self.tolerance:.1e}{noise}) {verdict}")


def compare(name: str, actual: np.ndarray, expected: np.ndarray, rtol: float = RTOL,
            atol: float = ATOL, min_cosine: float | None = None, noise: float = 0.0,
            cosine_noise: float = 0.0, bf16_noise: float = 0.0) -> OutputComparison:
    """Compare one output with its reference: floats within tolerance (or, with ``min_cosine``, by their
    cosine), everything else exactly.  ``noise``: the reference's own noise floor for this output; floats
    within :data:`NOISE_FACTOR` times it also match.  ``cosine_noise``: with ``min_cosine``, the reference's
    own cosine deficit, and ``bf16_noise`` that of the reference with bf16-rounded operands (bf16 artifacts);
    a deficit within :data:`NOISE_FACTOR` times either also matches."""
    expected, actual = np.asarray(expected), np.asarray(actual)
    if actual.shape != expected.shape:  # a wrong shape is a wrong answer, even with the right element count
        return OutputComparison(name, list(expected.shape), float("inf"), float("inf"), 0.0, expected.size,
                                expected.size, note=f"shape {list(actual.shape)}, expected {list(expected.shape)}")
    ref = expected.astype(np.float64)
    got = actual.astype(np.float64)
    floating = expected.dtype.kind in "fc"
    masked = mask_of(ref) if floating else np.zeros(ref.shape, bool)
    bad_masks = int((~masks_agree(got[masked], ref[masked], rtol)).sum()) if masked.any() else 0
    if masked.any():  # the numbers are judged without the masks, which are judged above
        got, ref = got[~masked], ref[~masked]
    finite = np.abs(ref[np.isfinite(ref)])
    scale = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    tol = atol * scale if floating else 0.0
    close = np.isclose(got, ref, rtol=rtol if floating else 0.0, atol=tol, equal_nan=True)
    if floating and noise > 0:
        with np.errstate(invalid="ignore"):
            close |= np.abs(got - ref) <= NOISE_FACTOR * noise
    with np.errstate(invalid="ignore"):
        diff = np.where(close & np.isnan(ref), 0.0, np.abs(got - ref))
    diff = np.nan_to_num(diff, nan=np.inf)
    rel = diff / np.maximum(np.abs(ref), tol if tol > 0 else 1.0)
    mask_note = f"{bad_masks} of {int(masked.sum())} masked element(s) not masked alike" if bad_masks else ""
    if bad_masks:
        diff = np.append(diff, np.inf)
    common = dict(masked=int(masked.sum()))
    if min_cosine is not None and floating:
        cos = cosine(got, ref)
        within = cos >= min_cosine or 1.0 - cos <= NOISE_FACTOR * max(cosine_noise, bf16_noise)
        note = mask_note or ("" if within else f"cosine {cos:.6f} < {min_cosine}")
        return OutputComparison(name, list(expected.shape), float(diff.max(initial=0.0)), float(rel.max(initial=0.0)),
                                tol, 0 if not note else int((~close).sum()) + bad_masks, int(expected.size), note, cos,
                                cosine_noise=cosine_noise, bf16_noise=bf16_noise, **common)
    return OutputComparison(name, list(expected.shape), float(diff.max(initial=0.0)), float(rel.max(initial=0.0)),
                            tol, int((~close).sum()) + bad_masks, int(expected.size), mask_note, noise=noise, **common)


def compare_outputs(ours: list[Any], refs: list[Any], rtol: float, atol: float,
                    min_cosine: float | None = None, noise: list[float] | None = None,
                    cosine_noise: list[float] | None = None, bf16_noise: list[float] | None = None) -> dict[str, Any]:
    """The worst output's ``max_abs_error`` and ``output_scale``, whether all outputs match, and with
    ``min_cosine`` the least cosine (``min_cosine`` is the criterion then); ``noise`` and ``cosine_noise``:
    the reference's noise floor and cosine deficit per output, ``bf16_noise`` its deficit with bf16-rounded
    operands (see :func:`compare`)."""
    noise = noise or [0.0] * len(refs)
    cosine_noise = cosine_noise or [0.0] * len(refs)
    bf16_noise = bf16_noise or [0.0] * len(refs)
    checks = [compare(str(i), out, ref, rtol, atol, min_cosine, n, c, b)
              for i, (out, ref, n, c, b) in enumerate(zip(ours, refs, noise, cosine_noise, bf16_noise))]
    worst = max(checks, key=lambda c: c.max_abs / max(c.tolerance / atol if atol else 1.0, 1e-30))
    result = {"max_abs_error": worst.max_abs, "output_scale": worst.tolerance / atol if atol else None,
              "outputs_match": all(c.ok for c in checks) and len(ours) == len(refs)}
    if any(c.noise for c in checks):
        result["noise_floor"] = max(c.noise for c in checks)
    if any(c.cosine_noise for c in checks):  # the least cosine of the reference with itself
        result["reference_cosine"] = 1.0 - max(c.cosine_noise for c in checks)
    if any(c.bf16_noise for c in checks):  # ... and with its bf16-rounded twin
        result["bf16_reference_cosine"] = 1.0 - max(c.bf16_noise for c in checks)
    cosines = [c.cosine for c in checks if c.cosine is not None]
    if cosines:
        result["min_cosine"] = min(cosines)
    return result
