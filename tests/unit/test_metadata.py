"""Metadata rendering: StrictUndefined, JSON validity, golden file (forgekit/artifact/metadata.py)."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest

from forgekit.artifact import metadata as md

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "metadata.json"

CONTEXT = {
    "uuid": "00000000-0000-4000-8000-000000000000",
    "created": "2023-11-14T22:13:20Z",
    "library": {"file": "model_library.so", "sha256": "ab" * 32, "size": 1234, "encrypted": False},
    "model": {
        "source": "convnet.onnx", "hash": "0123456789abcdef", "fingerprint": "cd" * 32, "precision": "float32",
        "layout": "NCHW",
        "inputs": [{"name": "input", "shape": ["N", 3, 16, 16], "dtype": "float32"}],
        "outputs": [{"name": "probs", "shape": ["N", 10], "dtype": "float32"}],
    },
    "build": {
        "opt_level": 3, "float16": False, "target": {"kind": "llvm", "mcpu": "znver4"},
        "host": {"kind": "llvm", "mcpu": "znver4"}, "target_name": "x86/znver4", "family": "x86",
        "device": {"os": "linux", "kind": "cpu"},
        "triple": "x86_64-linux-gnu", "arch": "x86_64", "cpu": "znver4", "features": [],
        "cpu_features": ["avx", "avx2", "avx512f", "fma", "sse", "sse2"], "gpu_arch": None,
        "toolchain": {"linker": "g++", "linker_version": "g++ 12"},
        "compile_seconds": 1.5,
        "io": {"input_alignment": "element", "owned_outputs": [True]},
    },
    "versions": {"forgekit": "0.1.0", "tvm": "0.27.0.post1", "tvm_ffi": "0.1.14.post0", "onnx": "1.20.0"},
}


CUDA_BUILD = {
    **CONTEXT["build"], "target": {"kind": "cuda", "arch": "sm_87"},
    "host": {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a78", "mattr": ["+neon", "+dotprod"]},
    "target_name": "jetson/orin", "family": "cuda",
    "device": {"os": "linux", "kind": "cuda", "gpu_arch": "sm_87", "gpu_generation": "Ampere", "cuda": "13.0",
               "min_driver": "580"},
    "triple": "aarch64-linux-gnu", "arch": "aarch64", "cpu": "cortex-a78", "features": ["+neon", "+dotprod"],
    "cpu_features": ["dotprod", "neon"], "gpu_arch": "sm_87",
    "toolchain": {"linker": "aarch64-linux-gnu-g++", "linker_version": "aarch64-linux-gnu-g++ 12",
                  "nvcc": "/usr/local/bin/nvcc", "nvcc_version": "13.0", "cuda_arch": "sm_87",
                  "device_code": "fatbin"},
    "io": None,
}


def test_cuda_rendering_matches_golden_file() -> None:
    """A Jetson build records host CPU and features, the GPU arch and the nvcc that built the kernels."""
    text = md.render_metadata(**{**CONTEXT, "build": CUDA_BUILD})
    golden = GOLDEN.parent / "metadata_cuda.json"
    assert text == golden.read_text(), "metadata layout changed: update tests/golden/metadata_cuda.json on purpose"


def test_rendering_matches_golden_file() -> None:
    text = md.render_metadata(**CONTEXT)
    assert text == GOLDEN.read_text(), "metadata layout changed: update tests/golden/metadata.json on purpose"
    assert json.loads(text)["model"]["inputs"][0]["shape"] == ["N", 3, 16, 16]


V2 = ["popcnt", "sse", "sse2", "sse3", "sse4.1", "sse4.2", "ssse3"]
PORTABLE_LIBRARY = {
    **CONTEXT["library"],
    "variants": [
        {"name": "x86-64-v4", "file": "model_library.x86-64-v4.so", "sha256": "01" * 32, "size": 1300,
         "cpu_features": sorted(V2 + ["avx", "avx2", "avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vl", "bmi",
                                      "bmi2", "f16c", "fma", "lzcnt", "movbe"])},
        {"name": "x86-64-v3", "file": "model_library.x86-64-v3.so", "sha256": "02" * 32, "size": 1280,
         "cpu_features": sorted(V2 + ["avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe"])},
        {"name": "x86-64-v2", "file": "model_library.so", "sha256": "ab" * 32, "size": 1234, "cpu_features": V2},
    ],
    # the arrays the levels share (forgekit/backends/cpu/shared_weights.py), stored once
    "weights": {"file": "model_weights.0123456789abcdef.bin", "sha256": "03" * 32, "size": 4096},
}
PORTABLE_BUILD = {
    **CONTEXT["build"], "target": {"kind": "llvm", "mcpu": "x86-64-v2", "mtriple": "x86_64-linux-gnu"},
    "host": {"kind": "llvm", "mcpu": "x86-64-v2", "mtriple": "x86_64-linux-gnu"}, "target_name": "x86-64",
    "cpu": "x86-64-v2", "cpu_features": V2, "levels": ["x86-64-v4", "x86-64-v3", "x86-64-v2"],
}


def test_portable_rendering_matches_golden_file() -> None:
    """A portable artifact lists each instruction-set level's library, best first, with what it needs of a
    CPU; the baseline (model_library.so) is last and is what build.cpu_features records."""
    text = md.render_metadata(**{**CONTEXT, "library": PORTABLE_LIBRARY, "build": PORTABLE_BUILD})
    golden = GOLDEN.parent / "metadata_portable.json"
    assert text == golden.read_text(), "metadata layout changed: update tests/golden/metadata_portable.json on purpose"
    data = json.loads(text)
    assert data["library"]["variants"][-1]["file"] == data["library"]["file"]
    assert data["build"]["cpu_features"] == data["library"]["variants"][-1]["cpu_features"]


def test_metadata_of_older_artifacts_still_renders() -> None:
    """forgekit 0.1 metadata has no device/cpu_features: re-rendering it (encrypt, decrypt) keeps working."""
    old = {**CONTEXT, "build": {k: v for k, v in CONTEXT["build"].items() if k not in ("device", "cpu_features")}}
    data = json.loads(md.render_metadata(**old))
    assert data["build"]["device"] is None and data["build"]["cpu_features"] == []


def test_missing_field_fails_loudly() -> None:
    broken = {k: v for k, v in CONTEXT.items() if k != "versions"}
    with pytest.raises(jinja2.UndefinedError):
        md.render_metadata(**broken)


def test_source_date_epoch(monkeypatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    assert md.created_timestamp() == "1970-01-01T00:00:00Z"
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    assert md.created_timestamp().endswith("Z")


def test_templates_ship_inside_the_package() -> None:
    from importlib import resources

    assert resources.files("forgekit.templates").joinpath("metadata.json.j2").is_file()
