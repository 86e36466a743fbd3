"""Every CPU build stores each distinct weight once, however many nodes use it (issue 39, point 6).

Legalization packs a constant weight once per use, so each call site of a shared initializer (an unrolled
LSTM's every step, two MatMuls on one matrix) held its own constant object; the lifter keyed them by object
and a ``-t host`` (and so every bf16) library stored the weight once per use: a 256x256 weight used by 8
MatMuls made a 2.1 MB library instead of 0.29 MB (an unrolled-BiLSTM CRNN: 275 MB instead of 22).  Portable
builds already stored them once (their shared file is keyed by content)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit as forge
from conftest import assert_close, ort_run
from forgekit.runtime import Engine
from forgekit.runtime.cpu import host_arch, host_features

needs_bf16 = pytest.mark.skipif("avx512bf16" not in host_features(),
                                reason="this CPU has no AVX512_BF16: bf16 artifacts compile but cannot run here")
x86_only = pytest.mark.skipif(host_arch() != "x86_64", reason="bf16 kernels are x86-64 only")

WEIGHT_BYTES = 256 * 256 * 4


def _reused(uses: int) -> onnx.ModelProto:
    """x -> Conv(k) -> Conv(k) (one 3x3 weight, two convs) -> Flatten -> uses x (MatMul(w) -> Tanh): an
    unrolled recurrence's shape, every step on the same matrix."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 16, 3, 3)) * 0.1).astype(np.float32), "k"),
             numpy_helper.from_array((rng.standard_normal((256, 256)) * 0.06).astype(np.float32), "w")]
    nodes = [helper.make_node("Conv", ["x", "k"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c0", "k"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c1", "shape"], ["h0"])]
    inits.append(numpy_helper.from_array(np.array([4, 256], np.int64), "shape"))
    for i in range(uses):
        nodes += [helper.make_node("MatMul", [f"h{i}", "w"], [f"m{i}"]),
                  helper.make_node("Tanh", [f"m{i}"], [f"h{i + 1}"])]
    nodes.append(helper.make_node("Identity", [f"h{uses}"], ["y"]))
    graph = helper.make_graph(nodes, "reused", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 256])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _build(uses: int, path, **options):
    model = _reused(uses)
    return model, forge.from_onnx(model).compile(target="host", output_path=path, **options)


def _check(tmp_path, cosine: float | None, **options) -> None:
    x = np.random.default_rng(1).standard_normal((1, 16, 8, 8)).astype(np.float32)
    _, once = _build(1, tmp_path / "once", **options)
    model, eight = _build(8, tmp_path / "eight", **options)
    grown = eight.library.stat().st_size - once.library.stat().st_size
    # 7 more uses add 7 small kernels' code and calls, never another copy of the 256 KiB weight
    assert grown < WEIGHT_BYTES // 2, (once.library.stat().st_size, eight.library.stat().st_size)
    actual, expected = Engine(eight.path).infer(x)[0], ort_run(model, {"x": x})[0]
    if cosine is None:
        assert_close(actual, expected)
    else:
        assert float(np.dot(actual.ravel(), expected.ravel())
                     / (np.linalg.norm(actual) * np.linalg.norm(expected))) >= cosine


def test_a_host_build_stores_a_weight_used_eight_times_once(tmp_path) -> None:
    _check(tmp_path, None)


@x86_only
@needs_bf16
def test_a_bf16_build_stores_a_weight_used_eight_times_once(tmp_path) -> None:
    _check(tmp_path, 0.999, set_bfloat16=True)
