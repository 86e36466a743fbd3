"""fp16 on every model class for CUDA (issue 36), on whole models: ResNet-50 (BN nodes kept), MobileNetV2
(depthwise, ReLU6), PP-OCRv4 det and rec (real weights), a BERT-style encoder and a YOLOv8n-style detector
(forgekit.testing.zoo) compile for cuda/sm_90 with set_float16 (nvcc, no GPU needed), and the very same fp16
graph built for the CPU matches fp32 onnxruntime (cosine >= 0.999 per output) on realistic inputs.

tests/unit/test_fp16_graphs.py has the blocks these models are made of, small enough for every run; this
file is the whole-model check (minutes: slow)."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import forgekit as forge
from forgekit.runtime import Engine
from forgekit.testing.zoo import MODELS, ModelUnavailable, example_feeds

onnxruntime = pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.slow


def _have_nvcc() -> bool:
    from forgekit.backends.cuda.nvcc import _wheel_nvcc

    return bool(os.environ.get("CUDA_HOME") or shutil.which("nvcc") or _wheel_nvcc())


def _model(name: str):
    try:
        return MODELS[name](batch=1)
    except ModelUnavailable as exc:  # PP-OCR's weights come with the rapidocr-onnxruntime wheel
        pytest.skip(str(exc))


@pytest.mark.skipif(not _have_nvcc(), reason="needs nvcc (pip install 'forgekit[cuda]')")
@pytest.mark.parametrize("name", sorted(MODELS))
def test_fp16_model_compiles_for_cuda(name, tmp_path) -> None:
    forge.from_onnx(_model(name)).compile(target="cuda/sm_90", output_path=tmp_path, set_float16=True)
    assert (tmp_path / "metadata.json").exists()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fp16_model_on_the_cpu_matches_fp32_onnxruntime(name, tmp_path) -> None:
    model = _model(name)
    forge.from_onnx(model).compile(target="host", output_path=tmp_path, set_float16=True)
    feeds = example_feeds(model)
    got = Engine(tmp_path).infer(*(feeds[i.name] for i in model.graph.input))
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert len(got) == len(want)
    for out, g, w in zip(model.graph.output, got, want):
        g, w = np.asarray(g, np.float64).ravel(), np.asarray(w, np.float64).ravel()
        cosine = g @ w / np.linalg.norm(g) / np.linalg.norm(w)
        assert cosine >= 0.999, f"{name} output {out.name}: cosine {cosine:.6f}"
        # it did compute in fp16: an fp32 build matches onnxruntime to ~1e-7 of the scale
        assert np.abs(g - w).max() > 1e-5 * np.abs(w).max(), f"{name} output {out.name} looks fp32"
