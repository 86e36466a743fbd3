"""The bf16 reference (forgekit/evaluate/bf16_reference.py): which operands it rounds and how, and the
allowance it gives verify/bench on an output that bf16 rounding alone moves more than a fixed cosine bar."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit as forge
from conftest import run_cli
from forgekit.evaluate.bf16_reference import bf16_model, bf16_noise, round_to_bf16
from forgekit.evaluate.compare import compare, cosine
from forgekit.runtime.cpu import host_features

needs_bf16 = pytest.mark.skipif("avx512bf16" not in host_features(),
                                reason="this CPU has no AVX512_BF16: bf16 artifacts compile but cannot run here")


def _model(nodes, inputs, output, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])  # Cast to bf16 needs 13
    model.ir_version = 7
    return model


def _run(model: onnx.ModelProto | bytes, feeds: dict) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_round_to_bf16_is_nearest_even() -> None:
    x = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -9, -2.5], np.float32)
    # 1 + 2^-8 is a tie between 1 and 1 + 2^-7: to the even mantissa (1); 1 + 3 * 2^-8 to 1 + 2^-6
    assert round_to_bf16(x).tolist() == [1.0, 1.0, 1 + 2 ** -6, 1.0, -2.5]


def test_conv_operands_are_rounded_as_the_kernels_round_them(tmp_path) -> None:
    """Conv input and weights, and a MatMul with a constant weight, are rounded (the activation by the
    three-node split, equal to round-to-nearest-even away from ties); a MatMul of two activations is not."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    m = rng.standard_normal((8, 5)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Transpose", ["c"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["t", "m"], ["y"])]
    model = _model(nodes, [("x", [1, 4, 6, 6])], "y", {"w": w, "m": m})
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    by_hand = _model(nodes[:2], [("x", [1, 4, 6, 6])], "t", {"w": round_to_bf16(w)})
    t = _run(by_hand, {"x": round_to_bf16(x)})
    np.testing.assert_allclose(_run(bf16_model(path), {"x": x}), round_to_bf16(t) @ round_to_bf16(m), rtol=1e-5,
                               atol=1e-5)
    # two activations: fp32, as forgekit's bf16 kernels leave them
    pair = _model([helper.make_node("MatMul", ["a", "b"], ["y"])], [("a", [4, 6]), ("b", [6, 3])], "y", {})
    onnx.save(pair, tmp_path / "pair.onnx")
    a, b = rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal((6, 3)).astype(np.float32)
    np.testing.assert_array_equal(_run(bf16_model(tmp_path / "pair.onnx"), {"a": a, "b": b}), _run(pair, {"a": a, "b": b}))


def test_the_split_rounds_like_nearest_even() -> None:
    """Veltkamp's split (what the rewritten graph computes for activations) against round_to_bf16 on 20000
    normal values: equal but for exact ties (about one in 65536 values), and those within one bf16 step."""
    x = np.random.default_rng(1).standard_normal(20000).astype(np.float32)
    c = x * np.float32(65537.0)
    split = c - (c - x)
    exact = round_to_bf16(x)
    assert (split != exact).sum() <= 3
    np.testing.assert_allclose(split, exact, rtol=2 ** -7)


def test_an_unreadable_model_gives_no_allowance(tmp_path) -> None:
    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    assert bf16_noise(tmp_path / "bad.onnx", {"x": np.zeros(3, np.float32)}, [np.zeros(3, np.float32)]) == [0.0]


def test_the_allowance_is_four_times_the_bf16_references_deficit() -> None:
    rng = np.random.default_rng(2)
    ref = rng.standard_normal(4096)
    noisy = ref + 0.2 * rng.standard_normal(4096)
    deficit = 1 - cosine(noisy, ref)
    assert not compare("y", noisy, ref, min_cosine=0.999).ok
    judged = compare("y", noisy, ref, min_cosine=0.999, bf16_noise=deficit / 3)
    assert judged.ok and "bf16-rounded conv/matmul operands" in judged.line() and "ill-conditioned" in judged.line()
    assert not compare("y", noisy, ref, min_cosine=0.999, bf16_noise=deficit / 5).ok
    assert not compare("y", np.roll(ref, 9), ref, min_cosine=0.999, bf16_noise=deficit / 3).ok  # a wrong output


def _cancelling(path) -> None:
    """y = conv(x, wa) - conv(x, wb) with wb within 1 % of wa: a difference of nearly equal sums, which bf16
    rounding of the operands moves by about 2 % (fp32: 1e-7)."""
    rng = np.random.default_rng(0)
    wa = (rng.standard_normal((32, 16, 3, 3)) * 0.1).astype(np.float32)
    wb = (wa * (1 + 0.01 * rng.standard_normal(wa.shape))).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "wa"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "wb"], ["b"], pads=[1, 1, 1, 1]), helper.make_node("Sub", ["a", "b"], ["y"])]
    model = _model(nodes, [("x", [1, 16, 8, 8])], "y", {"wa": wa, "wb": wb})
    onnx.save(model, path)


@needs_bf16
def test_verify_judges_an_output_that_bf16_rounding_moves_by_the_bf16_reference(tmp_path) -> None:
    """A correct bf16 artifact of a cancelling model: cosine 0.978 against fp32, as the bf16 reference's own;
    verify called it different (exit 13) before the allowance, now it passes and says why."""
    _cancelling(tmp_path / "m.onnx")
    forge.from_onnx(tmp_path / "m.onnx").compile(target="host", output_path=tmp_path / "a", set_bfloat16=True)
    proc = run_cli("verify", str(tmp_path / "a"), "--onnx", str(tmp_path / "m.onnx"))
    assert proc.returncode == 0, proc.stderr
    assert "bf16-rounded conv/matmul operands" in proc.stdout + proc.stderr
    proc = run_cli("bench", str(tmp_path / "a"), "--onnx", str(tmp_path / "m.onnx"), "-n", "2", "--no-memory")
    assert proc.returncode == 0, proc.stderr
    assert "outputs       match" in proc.stdout and "bf16-rounded conv/matmul operands" in proc.stdout, proc.stdout
