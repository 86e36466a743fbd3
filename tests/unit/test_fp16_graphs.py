"""fp16 (ToMixedPrecision) on the epilogues and blocks models are made of: each class compiles for CUDA
(nvcc, no GPU needed) and the very same fp16 graph built for the CPU matches fp32 onnxruntime (cosine >= 0.999).

ReLU6 (ONNX Clip) failed for CUDA fp16 with "Expected TensorType, but got R.Callable": TVM's Clip importer
emits call_tir(maximum/minimum), which ToMixedPrecision cannot type; the CPU pipeline rewrote them later, in
its own prefix, so only other backends saw them."""

from __future__ import annotations

import os
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit as forge
from forgekit.runtime import Engine

onnxruntime = pytest.importorskip("onnxruntime")


def _conv_block(epilogue: list[onnx.NodeProto], extra: list[onnx.TensorProto] | None = None) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.3, "w"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32) * 0.1, "b"),
             numpy_helper.from_array(rng.standard_normal((16, 16, 1, 1)).astype(np.float32) * 0.3, "w2"),
             *(extra or [])]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), *epilogue,
             helper.make_node("Conv", ["e", "w2"], ["c2"]),
             helper.make_node("Add", ["c2", "e"], ["y"])]  # a residual add after the epilogue
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 16, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _encoder_layer() -> onnx.ModelProto:
    """LayerNorm -> attention (MatMul, Softmax) -> GELU (Erf) MLP, residuals: a BERT-style layer."""
    rng = np.random.default_rng(1)
    d, s = 32, 16

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32), name)

    inits = [w("wq", d, d), w("wk", d, d), w("wv", d, d), w("w1", d, 4 * d), w("w2", 4 * d, d),
             numpy_helper.from_array(np.ones(d, np.float32), "g"), numpy_helper.from_array(np.zeros(d, np.float32), "bt"),
             numpy_helper.from_array(np.array(1 / np.sqrt(d), np.float32), "scale"),
             numpy_helper.from_array(np.array(np.sqrt(0.5), np.float32), "isq2"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"), numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "bt"], ["n"], axis=-1),
        helper.make_node("MatMul", ["n", "wq"], ["q"]), helper.make_node("MatMul", ["n", "wk"], ["k"]),
        helper.make_node("MatMul", ["n", "wv"], ["v"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"]), helper.make_node("Mul", ["qk", "scale"], ["qks"]),
        helper.make_node("Softmax", ["qks"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["a"]),
        helper.make_node("Add", ["x", "a"], ["r"]),
        helper.make_node("MatMul", ["r", "w1"], ["h"]), helper.make_node("Mul", ["h", "isq2"], ["hs"]),
        helper.make_node("Erf", ["hs"], ["he"]), helper.make_node("Add", ["he", "one"], ["h1"]),
        helper.make_node("Mul", ["h", "h1"], ["hh"]), helper.make_node("Mul", ["hh", "half"], ["g1"]),
        helper.make_node("MatMul", ["g1", "w2"], ["m"]), helper.make_node("Add", ["r", "m"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "encoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, s, d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, s, d])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


CLIP_BOUNDS = [numpy_helper.from_array(np.array(0, np.float32), "lo"),
               numpy_helper.from_array(np.array(6, np.float32), "hi")]
MODELS = {
    "relu6": lambda: _conv_block([helper.make_node("Clip", ["c", "lo", "hi"], ["e"])], CLIP_BOUNDS),
    "hardswish": lambda: _conv_block([helper.make_node("HardSwish", ["c"], ["e"])]),
    "hardsigmoid": lambda: _conv_block([helper.make_node("HardSigmoid", ["c"], ["e"])]),
    "silu": lambda: _conv_block([helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["e"])]),
    "encoder": _encoder_layer,
}


def _have_nvcc() -> bool:
    from forgekit.backends.cuda.nvcc import _wheel_nvcc

    return bool(os.environ.get("CUDA_HOME") or shutil.which("nvcc") or _wheel_nvcc())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fp16_graph_compiles_for_cuda_and_matches_on_the_cpu(name, tmp_path) -> None:
    model = MODELS[name]()
    if _have_nvcc():
        forge.from_onnx(model).compile(target="cuda/sm_90", output_path=tmp_path / "cuda", set_float16=True)
    forge.from_onnx(model).compile(target="host", output_path=tmp_path / "cpu", set_float16=True)
    x = np.random.default_rng(2).standard_normal([d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim])
    x = x.astype(np.float32)
    got = Engine(tmp_path / "cpu").infer(x)[0].ravel().astype(np.float64)
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0].ravel().astype(np.float64)
    cosine = got @ want / np.linalg.norm(got) / np.linalg.norm(want)
    assert cosine >= 0.999, cosine
    assert np.abs(got - want).max() > 0  # it did compute in fp16 (an fp32 build would match to ~1e-7)
