"""A CUDA artifact says what it needs (issue 36.4): metadata ``build.device`` (GPU architecture and generation,
CUDA release, oldest driver branch), the compile summary's "runs on" line and the model card; and running it
on a machine without a GPU is one line with exit 12 that says what GPU it needs (it named no GPU, and verify
told the user to use forgekit-run, which cannot run it either)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import onnx
import pytest

from forgekit.release.model_card import requirements
from onnx_models import tiny_conv_model


def _have_nvcc() -> bool:
    from forgekit.backends.cuda.nvcc import _wheel_nvcc

    return bool(os.environ.get("CUDA_HOME") or shutil.which("nvcc") or _wheel_nvcc())


pytestmark = pytest.mark.skipif(not _have_nvcc(), reason="needs nvcc (pip install 'forgekit[cuda]')")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "forgekit", *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def cuda_artifact(tmp_path_factory):
    model = tiny_conv_model()
    folder = tmp_path_factory.mktemp("cuda_device")
    onnx.save(model, folder / "m.onnx")
    done = _cli("compile", str(folder / "m.onnx"), "-t", "cuda/sm_90", "-o", str(folder / "out"))
    assert done.returncode == 0, done.stderr
    return folder, done.stdout


def test_metadata_summary_and_card_name_the_gpu(cuda_artifact) -> None:
    folder, summary = cuda_artifact
    build = json.loads((folder / "out" / "metadata.json").read_text())["build"]
    device = build["device"]
    assert device["kind"] == "cuda" and device["gpu_arch"] == "sm_90" and device["gpu_generation"] == "Hopper"
    assert device["cuda"] == build["toolchain"]["nvcc_version"] and device["min_driver"]
    line = next(ln for ln in summary.splitlines() if ln.startswith("runs on:"))
    assert "an NVIDIA GPU sm_90 (Hopper) with a CUDA" in line and "on a host of" in line, line
    assert requirements(build)["runs_on"].startswith("an NVIDIA GPU sm_90 (Hopper) with a CUDA")


@pytest.mark.parametrize("verb", ["run", "verify", "bench"])
def test_running_it_without_a_gpu_is_one_line_exit_12(cuda_artifact, verb) -> None:
    folder, _ = cuda_artifact
    extra = ["--random"] if verb == "run" else ["--onnx", str(folder / "m.onnx")]
    done = _cli(verb, str(folder / "out"), *extra)
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 12 and len(lines) == 1, done.stderr
    assert "needs an NVIDIA GPU sm_90 (Hopper) with a CUDA" in lines[0] and "forgekit-run" not in lines[0]


def test_older_cuda_metadata_still_described() -> None:
    """Artifacts from before build.device recorded the GPU: the card falls back to build.gpu_arch."""
    old = {"arch": "x86_64", "cpu_features": [], "family": "cuda", "device": {"os": "linux", "kind": "cuda"},
           "gpu_arch": "sm_80"}
    assert requirements(old)["runs_on"].startswith("an NVIDIA GPU sm_80")
