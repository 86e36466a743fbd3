"""Winograd beyond static, padding-1 convolutions (forgekit/backends/cpu/winograd.py): 3x3 convolutions whose
height, width or batch is symbolic, whose height is dilated, or whose padding is not 1 take the Winograd path too.

The classes covered: a dynamic image (a detector's or recognizer's H and W, an audio model's frame count) of one
image, a dynamic batch of static images, a dilated height (PLCMOS's (2, 1) over frames), any padding, with a
bias and SiLU epilogue where one size is static and the other symbolic (ddddocr's recognizer: TVM could not
prove the tiles covered while the tile count was spelled -(-W // m)), and a symbolic H or W over a symbolic batch
(a detector exported with batch, height and width dynamic: the images stacked into one tall image).  A dilated
width keeps the direct kernel.  Before, all of them did: a 64->64 conv at 56x56 with H, W dynamic
ran 2.46 ms against 0.98 ms now (the static Winograd build: 1.03 ms, 2 threads, Zen 4)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit as forge
from conftest import ort_run
from forgekit.backends import cpu


def _conv_relu(c: int, k: int, shape: list, dilations=(1, 1), pads=(1, 1, 1, 1), silu: bool = False) -> object:
    """Conv 3x3 then ReLU, or with a bias and SiLU (x * sigmoid(x): an epilogue of two consumers)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((k, c, 3, 3)).astype(np.float32) * 0.05, "w"),
             numpy_helper.from_array(rng.standard_normal(k).astype(np.float32), "b")]
    act = [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])] if silu \
        else [helper.make_node("Relu", ["c"], ["y"])]
    nodes = [helper.make_node("Conv", ["x", "w", "b"] if silu else ["x", "w"], ["c"], pads=list(pads),
                              dilations=list(dilations)), *act]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


#: name: (model, --dynamic bounds, sizes run, whether Winograd applies)
CASES = {
    "H and W": (lambda: _conv_relu(64, 64, [1, 64, "H", "W"]), {"H": "1..2048", "W": "1..2048"},
                [(1, 64, 56, 56), (1, 64, 37, 61), (1, 64, 1, 5), (1, 64, 3, 200)], True),
    "H only (frames), static width": (lambda: _conv_relu(64, 128, [1, 64, "T", 16]), {"T": "1..5000"},
                                      [(1, 64, 300, 16), (1, 64, 7, 16)], True),
    "batch of static images": (lambda: _conv_relu(32, 32, ["N", 32, 20, 20]), {"N": "1..64"},
                               [(1, 32, 20, 20), (3, 32, 20, 20)], True),
    "batch and H, W": (lambda: _conv_relu(32, 32, ["N", 32, "H", "W"]), {"N": "1..8", "H": "1..512", "W": "1..512"},
                       [(2, 32, 20, 24), (1, 32, 9, 9), (3, 32, 5, 37)], True),
    "batch and H, W, bias + SiLU, F(4x4)": (
        lambda: _conv_relu(64, 64, ["N", 64, "H", "W"], silu=True), {"N": "1..8", "H": "1..512", "W": "1..512"},
        [(2, 64, 30, 17), (3, 64, 6, 6), (1, 64, 1, 9)], True),
    "a static batch of 2, H and W": (lambda: _conv_relu(32, 32, [2, 32, "H", "W"]), {"H": "1..512", "W": "1..512"},
                                     [(2, 32, 11, 14), (2, 32, 4, 4)], True),
    "batch and H, static W, padding (2, 1, 0, 2)": (
        lambda: _conv_relu(32, 64, ["N", 32, "H", 19], pads=(2, 1, 0, 2)), {"N": "1..8", "H": "1..512"},
        [(2, 32, 13, 19), (4, 32, 2, 19)], True),
    "bias + SiLU, static H, symbolic W": (lambda: _conv_relu(64, 64, [1, 64, 16, "W"], silu=True), {"W": "1..4096"},
                                          [(1, 64, 16, 40), (1, 64, 16, 7)], True),
    "bias + SiLU, symbolic H, static W": (lambda: _conv_relu(64, 64, [1, 64, "H", 16], silu=True), {"H": "1..4096"},
                                          [(1, 64, 40, 16), (1, 64, 3, 16)], True),
    "dilated height (2, 1) over frames, bias + SiLU": (
        lambda: _conv_relu(32, 64, [1, 32, "T", 64], dilations=(2, 1), silu=True), {"T": "3..5000"},
        [(1, 32, 300, 64), (1, 32, 9, 64)], True),
    "dilated height (3, 1), padding 0, static": (
        lambda: _conv_relu(32, 32, [1, 32, 30, 31], dilations=(3, 1), pads=(0, 0, 0, 0)), None, [(1, 32, 30, 31)],
        True),
    "padding (2, 1, 0, 2), H and W": (lambda: _conv_relu(32, 64, [1, 32, "H", "W"], pads=(2, 1, 0, 2)),
                                      {"H": "1..512", "W": "1..512"}, [(1, 32, 30, 31), (1, 32, 5, 7)], True),
    "dilated width (1, 2)": (lambda: _conv_relu(32, 32, [1, 32, 30, 31], dilations=(1, 2)), None,
                             [(1, 32, 30, 31)], False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_dynamic_sizes_take_winograd_and_match_onnxruntime(case: str) -> None:
    make, dynamic, sizes, winograd = CASES[case]
    model = make()
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
