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
from onnx import numpy_helper

import forgekit as forge
from forgekit.runtime import Engine
from forgekit.testing.zoo import MODELS, WEIGHT_INPUTS, ModelUnavailable, example_feeds

onnxruntime = pytest.importorskip("onnxruntime")


def _have_nvcc() -> bool:
    from forgekit.backends.cuda.nvcc import _wheel_nvcc

    return bool(os.environ.get("CUDA_HOME") or shutil.which("nvcc") or _wheel_nvcc())


def _model(name: str):
    try:
        return MODELS[name](batch=1)
    except ModelUnavailable as exc:  # PP-OCR's weights come with the rapidocr-onnxruntime wheel
        pytest.skip(str(exc))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_zoo_model_runs_and_levels_round_only_weights(name) -> None:
    """Seconds, not slow: the zoo a GPU bench ships (levels=16) stays a working model of the same graph."""
    model, rounded = _model(name), MODELS[name](batch=1, levels=16)
    feeds = example_feeds(model)
    assert set(feeds) == {i.name for i in model.graph.input}
    for m in (model, rounded):
        outs = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        assert all(np.isfinite(o).all() and np.abs(o).max() > 0 for o in outs)
    assert [n.op_type for n in rounded.graph.node] == [n.op_type for n in model.graph.node]
    weights = {n.input[i] for n in model.graph.node if (i := WEIGHT_INPUTS.get(n.op_type, -1)) >= 0}
    tensors = {t.name: t for t in rounded.graph.initializer}
    tensors.update({n.output[0]: n.attribute[0].t for n in rounded.graph.node if n.op_type == "Constant"})
    originals = {t.name: t for t in model.graph.initializer}
    originals.update({n.output[0]: n.attribute[0].t for n in model.graph.node if n.op_type == "Constant"})
    changed = 0
    for key, t in tensors.items():
        a, b = numpy_helper.to_array(originals[key]), numpy_helper.to_array(t)
        if key not in weights or a.dtype != np.float32:
            assert np.array_equal(a, b), key  # statistics, biases, anchors, shapes stay exact
        elif a.ndim > 1 and a.size > 16:
            rows = b.reshape(b.shape[0], -1)
            assert max(np.unique(r).size for r in rows) <= 16, key
            changed += not np.array_equal(a, b)
    assert changed


@pytest.mark.slow
@pytest.mark.skipif(not _have_nvcc(), reason="needs nvcc (pip install 'forgekit[cuda]')")
@pytest.mark.parametrize("name", sorted(MODELS))
def test_fp16_model_compiles_for_cuda(name, tmp_path) -> None:
    forge.from_onnx(_model(name)).compile(target="cuda/sm_90", output_path=tmp_path, set_float16=True)
    assert (tmp_path / "metadata.json").exists()


@pytest.mark.slow
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
    for out, g, w in zip(model.graph.output, got, want):
        # Row by row too: the cosine of a detector's [1, 84, N] is its box coordinates (pixels, hundreds); class
        # scores (at most 1) do not register in it.  A row is noisier than a whole output (PP-OCR rec's worst
        # time step: 0.9985), hence the lower bar.
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if g.ndim == 3:
            rows = np.einsum("bij,bij->bi", g, w) / np.linalg.norm(g, axis=2) / np.linalg.norm(w, axis=2)
            assert rows.min() >= 0.995, f"{name} output {out.name} row {np.unravel_index(rows.argmin(), rows.shape)}: {rows.min():.6f}"
