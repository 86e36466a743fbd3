"""Winograd on dynamic sizes (forgekit/backends/cpu/winograd.py): 3x3 convolutions whose height, width or batch
is symbolic take the Winograd path too.

The class covered: a dynamic image (a detector's or recognizer's H and W, an audio model's frame count) of one
image, and a dynamic batch of static images; a symbolic H or W over a symbolic batch keeps the direct kernel.
Before, every symbolic size kept the direct kernel: a 64->64 conv at 56x56 ran 2.46 ms against 0.98 ms now (the
static Winograd build: 1.03 ms, 2 threads, Zen 4)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit as forge
from conftest import ort_run
from forgekit.backends import cpu


def _conv_relu(c: int, k: int, shape: list, dilations=(1, 1)) -> object:
    w = np.random.default_rng(0).standard_normal((k, c, 3, 3)).astype(np.float32) * 0.05
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], dilations=list(dilations)),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


#: name: (channels in, out, declared shape, --dynamic bounds, sizes run, whether Winograd applies)
CASES = {
    "H and W": (64, 64, [1, 64, "H", "W"], {"H": "1..2048", "W": "1..2048"},
                [(1, 64, 56, 56), (1, 64, 37, 61), (1, 64, 1, 5), (1, 64, 3, 200)], True),
    "H only (frames), static width": (64, 128, [1, 64, "T", 16], {"T": "1..5000"},
                                      [(1, 64, 300, 16), (1, 64, 7, 16)], True),
    "batch of static images": (32, 32, ["N", 32, 20, 20], {"N": "1..64"}, [(1, 32, 20, 20), (3, 32, 20, 20)], True),
    "batch and H, W": (32, 32, ["N", 32, "H", "W"], {"N": "1..8", "H": "1..512", "W": "1..512"},
                       [(2, 32, 20, 24), (1, 32, 9, 9)], False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_dynamic_sizes_take_winograd_and_match_onnxruntime(case: str) -> None:
    c, k, shape, dynamic, sizes, winograd = CASES[case]
    model = _conv_relu(c, k, shape)
    cpu.STATS.clear()
    run = forge.from_onnx(model, dynamic=dynamic).get_inference_function("host", opt_level=3)
    rules = set(cpu.STATS.values())
    assert ("winograd" in rules) == winograd, cpu.STATS
    rng = np.random.default_rng(1)
    for size in sizes:
        x = rng.random(size, dtype=np.float32)
        ref = ort_run(model, {"x": x})[0]
        got = np.asarray(run(x))
        assert got.shape == ref.shape
        # F(4x4, 3x3) loses about a decimal digit against the direct sum (module docstring): 4e-6 relative
        assert np.abs(got - ref).max() <= 2e-5 * np.abs(ref).max(), size
