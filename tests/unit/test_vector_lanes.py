"""Vector loops of a power-of-two number of lanes (forgekit/backends/cpu/vector_lanes.py).

A loop vectorized over 24 (or 40, 12, ...) lanes is a ``<24 x float>`` that x86 widens to ``<32 x float>``;
the undefined lanes were read from whatever followed an operand in memory and, as a denormal or NaN pattern,
cost a microcode assist on each operation of the epilogue: a 1 -> 24 stride-2 conv + SiLU over 64 x 320 took
0.93 ms where its twin took 0.043 ms (2 threads, an AVX-512 Xeon), bimodal between processes.  The class: every
kernel with an innermost vector loop whose extent is not a power of two (channel counts 24, 40, 48, 12 in an
epilogue, a bias, a transpose), any activation; assists happen only on Intel cores and only for some memory
contents, so the tests check what the library is built from: no floating-point arithmetic on a vector of another
width is left in its LLVM IR, and the results still match onnxruntime."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit
from conftest import assert_close, library_ir, ort_run
from forgekit.backends.cpu.vector_lanes import MIN_LANES, power_of_two_parts

#: floating-point arithmetic on a vector (what takes the assists; LLVM's own loop vectorizer stores interleaved
#: <24 x float> shuffles of a 3-channel transpose, which compute nothing)
_ARITHMETIC = re.compile(r"= (?:fadd|fsub|fmul|fdiv|fneg|fcmp \w+|call)(?: \w+)* <(\d+) x (?:float|half|bfloat|double)>")


def _conv_silu(channels: int, width: int | str, stride: int = 2) -> object:
    """A stem: conv of 3 -> ``channels`` then SiLU (x * sigmoid(x)), over an image ``width`` wide."""
    rng = np.random.default_rng(channels)
    w = numpy_helper.from_array((rng.standard_normal((channels, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1] * 4, strides=[stride] * 2),
         helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])], "stem",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _row_tanh(features: int) -> object:
    """A [rows, features] matmul + bias + tanh: a vector loop over ``features`` outside any conv."""
    rng = np.random.default_rng(features)
    w = numpy_helper.from_array(rng.standard_normal((32, features)).astype(np.float32) * 0.2, "w")
    b = numpy_helper.from_array(rng.standard_normal(features).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
         helper.make_node("Tanh", ["a"], ["y"])], "rows",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("extent, parts", [(24, [16, 8]), (40, [32, 8]), (12, [8, 4]), (48, [32, 16]),
                                           (7, [4, 3]), (6, [4, 2]), (29, [16, 8, 4, 1]), (16, [16])])
def test_an_extent_splits_into_powers_of_two_largest_first(extent: int, parts: list[int]) -> None:
    assert power_of_two_parts(extent) == parts
    assert all(p & (p - 1) == 0 for p in parts if p >= MIN_LANES)


@pytest.mark.parametrize("model", [
    pytest.param(_conv_silu(24, "W"), id="conv_silu_24ch_dynamic_width"),
    pytest.param(_conv_silu(24, 64), id="conv_silu_24ch_static"),
    pytest.param(_conv_silu(40, "W"), id="conv_silu_40ch_dynamic_width"),
    pytest.param(_conv_silu(12, 48, stride=1), id="conv_silu_12ch"),
    pytest.param(_row_tanh(24), id="matmul_bias_tanh_24"),
])
def test_no_vector_of_a_width_that_is_not_a_power_of_two_reaches_llvm(model: object) -> None:
    widths = {int(n) for n in _ARITHMETIC.findall(library_ir(model))}
    assert widths, "no float vector at all: the kernels were not vectorized"
    assert all(n & (n - 1) == 0 for n in widths), f"vector widths in the library: {sorted(widths)}"


@pytest.mark.parametrize("channels", [24, 40])
def test_partitioned_epilogues_match_onnxruntime_at_several_widths(channels: int, tmp_path) -> None:
    model = _conv_silu(channels, "W")
    out = tmp_path / "stem"
    forgekit.from_onnx(model).compile("host", output_path=out, force_overwrite=True)
    engine = forgekit.Engine(out)
    for width in (5, 64, 317):
        x = np.random.default_rng(width).standard_normal((1, 3, 16, width)).astype(np.float32)
        assert_close(engine.infer(x)[0], ort_run(model, {"x": x})[0])
