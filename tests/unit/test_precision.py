"""Precision is one type (forgekit.options.Precision), resolved once in CompileOptions from every spelling."""

from __future__ import annotations

import json

import pytest

from forgekit.errors import UsageError
from forgekit.options import PRECISION_NAMES, PRECISIONS, CompileOptions, Precision


@pytest.mark.parametrize("spelling, expected", [("fp32", Precision.FP32), ("float32", Precision.FP32),
                                                ("FP16", Precision.FP16), ("float16", Precision.FP16),
                                                ("bf16", Precision.BF16), ("bfloat16", Precision.BF16),
                                                (Precision.BF16, Precision.BF16)])
def test_every_spelling_resolves_once_in_compile_options(spelling, expected) -> None:
    assert CompileOptions(precision=spelling).precision is expected


def test_forge_flags_resolve_to_the_same_type() -> None:
    assert CompileOptions.from_forge(set_float16=True).precision is Precision.FP16
    assert CompileOptions.from_forge(set_bfloat16=True).precision is Precision.BF16
    assert CompileOptions.from_forge().precision is Precision.FP32


def test_a_precision_is_its_long_name_wherever_a_string_was() -> None:
    """Metadata, compile reports and callers that compared with "float16" see what they saw before."""
    assert Precision.FP16 == "float16" and str(Precision.BF16) == "bfloat16" and f"{Precision.FP32}" == "float32"
    assert json.dumps({"precision": Precision.FP16}) == '{"precision": "float16"}'
    assert PRECISIONS == ("float32", "float16", "bfloat16")
    assert {p.short for p in Precision} == {"fp32", "fp16", "bf16"} <= set(PRECISION_NAMES)


@pytest.mark.parametrize("bad", ["int8", "half", 16, None])
def test_an_unknown_precision_is_one_line(bad) -> None:
    with pytest.raises(UsageError, match=r"^Unsupported precision '.*': use one of float32, float16, bfloat16\.$"):
        CompileOptions(precision=bad)
