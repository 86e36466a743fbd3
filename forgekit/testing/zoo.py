"""A model zoo for tests and benches: six models of the classes people compile (ImageNet CNNs, a
depthwise mobile net, a detector, OCR, a transformer encoder) at their real shapes, seeded, offline.

    from forgekit.testing.zoo import MODELS, example_feeds
    model = MODELS["resnet50"](batch=1, levels=16)
    feeds = example_feeds(model)

Every builder is ``name(batch=1, levels=None) -> onnx.ModelProto``.  ``levels`` rounds the weights
(:func:`quantize_levels`: each output channel to that many evenly spaced values, zero among them): the same
graph and numerics class (the values change: compare with onnxruntime on the same rounded model), but the
model and its compiled artifacts compress ~5x with xz (a GPU bench ships them in a small archive).

PP-OCRv4's detector and recognizer are the real models from the ``rapidocr-onnxruntime`` wheel (found, not
imported: its ``__init__`` needs OpenCV); :class:`ModelUnavailable` says so when the wheel is missing."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from .zoo_cnn import mobilenetv2 as _mobilenetv2
from .zoo_cnn import resnet50 as _resnet50
from .zoo_cnn import text_image
from .zoo_cnn import yolov8_style as _yolov8_style
from .zoo_nlp import bert_style as _bert_style

# PP-OCRv4 det is fully convolutional; 640x640 is its usual serving size (rapidocr limits the long side to
# 736), rec reads 48-pixel-high lines, 320 wide by default.
DET_SIZE = 640
REC_SHAPE = (48, 320)


class ModelUnavailable(RuntimeError):
    """A zoo model whose weights come with a package that is not installed."""


# The inputs that hold a layer's weights: the bulk of a model's bytes.
WEIGHT_INPUTS = {"Conv": 1, "ConvTranspose": 1, "MatMul": 1, "Gemm": 1, "Gather": 0}


def quantize_levels(model: onnx.ModelProto, levels: int) -> onnx.ModelProto:
    """Round every weight tensor (a constant read as Conv/ConvTranspose/MatMul/Gemm weights or a Gather table,
    from an initializer or a Constant node) with more than ``levels`` distinct values: each slice along axis 0
    (output channel, row) to at most ``levels`` evenly spaced values spanning its min and max, zero among them.

    Only weights: rounding batch-norm statistics too made PP-OCR's activations overflow fp16 (a variance
    rounded from 1e-3 to its tensor's minimum scales its channel up 30x, layer after layer: rec reached
    3.5e14 in fp32, det 1.4e6), and biases, statistics, anchors or Resize scales are few bytes anyway.

    Trained weights take coarse rounding worse than seeded ones: PP-OCRv4 det at 16 levels is a network so
    ill-conditioned that fp16 weights alone move its output to cosine 0.998 (fp16 build 0.997 against fp32
    onnxruntime); at 32 levels it is 0.9999 like the unrounded model.  All six at 16 levels are 29 MB with
    ``xz -6``, at 32 levels 38 MB."""
    if levels < 3:
        raise ValueError(f"levels must be at least 3, got {levels}")
    weights = {n.input[i] for n in model.graph.node if (i := WEIGHT_INPUTS.get(n.op_type, -1)) >= 0 and len(n.input) > i}

    def rounded(t: onnx.TensorProto) -> onnx.TensorProto | None:
        if t.data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE):
            return None
        a = numpy_helper.to_array(t)
        if a.size <= levels or np.unique(a).size <= levels:
            return None
        # One grid per slice along axis 0 (a conv's output channel, a table's row): a trained conv's channels
        # differ 100x in scale, and one grid per tensor zeroed the small ones (PP-OCR det output all zeros).
        # Multiples of the step, so that 0 is a level: a grid anchored at the min put the many near-zero
        # weights on a level up to step/2 off zero, a bias summed over the whole fan-in.
        rows = a.reshape(a.shape[0], -1).astype(np.float64) if a.ndim > 1 else a.reshape(1, -1).astype(np.float64)
        step = (rows.max(1, keepdims=True) - rows.min(1, keepdims=True)) / (levels - 2)
        step[step == 0] = 1.0  # a constant row is its own level
        q = np.where(rows.max(1, keepdims=True) == rows.min(1, keepdims=True), rows, np.round(rows / step) * step)
        return numpy_helper.from_array(q.reshape(a.shape).astype(a.dtype), t.name)

    out = onnx.ModelProto()
    out.CopyFrom(model)
    for t in out.graph.initializer:
        if t.name in weights and (new := rounded(t)) is not None:
            t.CopyFrom(new)
    for node in out.graph.node:  # PP-OCR (paddle2onnx) keeps its weights in Constant nodes
        if node.op_type != "Constant" or node.output[0] not in weights:
            continue
        for attr in node.attribute:
            if attr.name == "value" and (new := rounded(attr.t)) is not None:
                attr.t.CopyFrom(new)
    return out


def _with_levels(model: onnx.ModelProto, levels: int | None) -> onnx.ModelProto:
    return model if levels is None else quantize_levels(model, levels)


def resnet50(batch: int = 1, levels: int | None = None) -> onnx.ModelProto:
    return _with_levels(_resnet50(batch), levels)


def mobilenetv2(batch: int = 1, levels: int | None = None) -> onnx.ModelProto:
    return _with_levels(_mobilenetv2(batch), levels)


def yolov8_style(batch: int = 1, levels: int | None = None) -> onnx.ModelProto:
    return _with_levels(_yolov8_style(batch), levels)


def bert_style(batch: int = 1, levels: int | None = None) -> onnx.ModelProto:
    return _with_levels(_bert_style(batch), levels)


def rapidocr_model(fname: str) -> Path:
    """The path of a model shipped in the rapidocr-onnxruntime wheel; :class:`ModelUnavailable` without it."""
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailable("PP-OCRv4 models come with rapidocr-onnxruntime: "
                               "pip install --no-deps rapidocr-onnxruntime==1.4.4 (./dev.sh test installs it)")
    path = Path(list(spec.submodule_search_locations)[0]) / "models" / fname
    if not path.exists():
        raise ModelUnavailable(f"{path} is not shipped with this rapidocr-onnxruntime")
    return path


def _pinned(fname: str, shape: list[int], levels: int | None) -> onnx.ModelProto:
    """The wheel's model with its one input's dynamic dims pinned (its outputs' dims stay symbolic: the
    importer infers them)."""
    model = onnx.load(str(rapidocr_model(fname)))
    dims = model.graph.input[0].type.tensor_type.shape.dim
    for dim, value in zip(dims, shape):
        dim.Clear()
        dim.dim_value = value
    onnx.checker.check_model(model)
    return _with_levels(model, levels)


def ppocr_det(batch: int = 1, levels: int | None = None) -> onnx.ModelProto:
    """PP-OCRv4 text detector (DBNet, PP-LCNet backbone): x [batch,3,640,640] -> probability map."""
    return _pinned("ch_PP-OCRv4_det_infer.onnx", [batch, 3, DET_SIZE, DET_SIZE], levels)


def ppocr_rec(batch: int = 1, levels: int | None = None) -> onnx.ModelProto:
    """PP-OCRv4 text recognizer (SVTR-LCNet, CTC over 6625 characters): x [batch,3,48,320] -> [batch,40,6625]."""
    return _pinned("ch_PP-OCRv4_rec_infer.onnx", [batch, 3, *REC_SHAPE], levels)


MODELS: dict[str, Callable[..., onnx.ModelProto]] = {
    "resnet50": resnet50,
    "mobilenetv2": mobilenetv2,
    "ppocr_det": ppocr_det,
    "ppocr_rec": ppocr_rec,
    "bert_style": bert_style,
    "yolov8_style": yolov8_style,
}


def _vocab_of(model: onnx.ModelProto, name: str) -> int | None:
    """Rows of the embedding table a Gather indexes with input ``name``."""
    tables = {t.name: t.dims for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] == name and node.input[0] in tables:
            return int(tables[node.input[0]][0])
    return None


def example_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Realistic inputs: images in [0, 1) (:func:`text_image`), token ids inside the vocabulary, attention
    masks of ones ending in some zeros (padding), as a tokenizer pads a batch."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        tt = inp.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 1 for d in tt.shape.dim]
        if tt.elem_type == TensorProto.INT64 and "mask" in inp.name:
            mask = np.ones(shape, np.int64)
            for row in mask.reshape(-1, shape[-1]):
                row[shape[-1] - int(rng.integers(1, max(2, shape[-1] // 4))):] = 0
            feeds[inp.name] = mask
        elif tt.elem_type == TensorProto.INT64:
            feeds[inp.name] = rng.integers(0, _vocab_of(model, inp.name) or 1000, shape, dtype=np.int64)
        elif len(shape) == 4:
            feeds[inp.name] = text_image(rng, shape)
        else:
            feeds[inp.name] = rng.random(shape, dtype=np.float32)
    return feeds
