"""forgekit/evaluate/compare.py: elementwise tolerances for fp32 artifacts, the cosine criterion for
artifacts that compute in less (bf16/fp16, forgekit-quantized)."""

from __future__ import annotations

import numpy as np
import pytest

from forgekit.evaluate.compare import compare, compare_outputs, cosine, min_cosine_for


def _bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 (nearest even) and back: what a bf16 kernel's inputs lose."""
    bits = x.astype(np.float32).view(np.uint32)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("meta, expected", [
    ({"precision": "float32"}, None), ({"precision": "bfloat16"}, 0.999), ({"precision": "float16"}, 0.999),
    ({"precision": "float32", "quantization": {"activation_dtype": "int8"}}, 0.99), ({}, None)])
def test_criterion_follows_the_artifacts_arithmetic(meta, expected) -> None:
    assert min_cosine_for(meta) == expected


def test_bf16_rounding_fails_fp32_tolerances_and_passes_the_cosine() -> None:
    ref = np.random.default_rng(0).standard_normal((4, 100)).astype(np.float32)
    got = _bf16(ref)
    assert not compare("y", got, ref).ok  # 2**-9 relative error is past rtol 1e-3
    judged = compare("y", got, ref, min_cosine=0.999)
    assert judged.ok and judged.cosine > 0.99999 and "cosine" in judged.line()
    summary = compare_outputs([got], [ref], 1e-3, 1e-4, 0.999)
    assert summary["outputs_match"] and summary["min_cosine"] > 0.99999


def test_the_cosine_still_catches_wrong_outputs() -> None:
    ref = np.random.default_rng(1).standard_normal(256).astype(np.float32)
    wrong = compare("y", np.roll(ref, 1), ref, min_cosine=0.99)
    assert not wrong.ok and "cosine" in wrong.note and "MISMATCH" in wrong.line()
    assert not compare("y", ref[:128], ref, min_cosine=0.99).ok  # a wrong shape is wrong under any criterion
    ints = np.arange(6)
    assert not compare("i", ints + 1, ints, min_cosine=0.99).ok  # integers stay exact
    assert cosine(np.zeros(3), np.zeros(3)) == 1.0
