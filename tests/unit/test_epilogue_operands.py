"""Run-time per-channel vectors (a dynamically quantized conv's bias) stay out of the conv kernels that read
them (``forgekit/backends/cpu/epilogue_operands.py``).

onnxruntime's ``quantize_dynamic`` writes a ConvInteger's bias as ``Cast(Floor(bias / (x_scale * w_scale)))``
with ``x_scale`` known at run time; fused into the convolution's kernel, that chain made it a kernel no
conv rule took (the generic pool schedule, recomputing the chain per element).  ddddocr's quantized
recognizer: 20 such convolutions 17 ms of 33 before, about 7 ms after; compile 124 s -> 35 s."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import onnx
from onnx import TensorProto, helper, numpy_helper

import forgekit
from forgekit.runtime import Engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import ort_run  # noqa: E402


def _dynamic_quantized_cnn(tmp_path: Path, width: int | str = 40) -> Path:
    """Three ConvInteger layers as onnxruntime 1.x's ``quantize_dynamic`` wrote them (ddddocr's recognizer):
    the int32 bias quantized at run time with the input's scale, ``Cast(Floor(bias / (x_scale * w_scale)))``,
    added to the integer convolution, then dequantized and a SiLU.  ``width``: a name keeps it dynamic."""
    rng = np.random.default_rng(0)
    inits, nodes, x = [], [], "x"
    for i, (cin, cout) in enumerate([(3, 16), (16, 32), (32, 32)]):
        w_scale = np.float32(0.01 + 0.005 * i)
        inits += [numpy_helper.from_array(rng.integers(0, 256, (cout, cin, 3, 3)).astype(np.uint8), f"w{i}"),
                  numpy_helper.from_array(np.uint8(121 + i), f"wz{i}"),
                  numpy_helper.from_array(w_scale, f"ws{i}"),
                  numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), f"b{i}"),
                  numpy_helper.from_array(np.array([1, cout, 1, 1], np.int64), f"shape{i}")]
        nodes += [helper.make_node("DynamicQuantizeLinear", [x], [f"q{i}", f"s{i}", f"z{i}"]),
                  helper.make_node("ConvInteger", [f"q{i}", f"w{i}", f"z{i}", f"wz{i}"], [f"acc{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Mul", [f"s{i}", f"ws{i}"], [f"scale{i}"]),
                  helper.make_node("Div", [f"b{i}", f"scale{i}"], [f"bd{i}"]),
                  helper.make_node("Floor", [f"bd{i}"], [f"bf{i}"]),
                  helper.make_node("Cast", [f"bf{i}"], [f"bi{i}"], to=TensorProto.INT32),
                  helper.make_node("Reshape", [f"bi{i}", f"shape{i}"], [f"br{i}"]),
                  helper.make_node("Add", [f"acc{i}", f"br{i}"], [f"ab{i}"]),
                  helper.make_node("Cast", [f"ab{i}"], [f"af{i}"], to=TensorProto.FLOAT),
                  helper.make_node("Mul", [f"af{i}", f"scale{i}"], [f"c{i}"]),
                  helper.make_node("Sigmoid", [f"c{i}"], [f"sg{i}"]),
                  helper.make_node("Mul", [f"c{i}", f"sg{i}"], [f"a{i}"])]
        x = f"a{i}"
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 24, width])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], inits)
    path = tmp_path / "q.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


@pytest.mark.parametrize("width", [40, "W"])
def test_dynamic_quantized_convolutions_keep_their_conv_schedule(tmp_path: Path, width: int | str) -> None:
    """Also with the width dynamic: the reader's symbolic size counted as small, and the chain fused back into
    every convolution (ddddocr's recognizer: 7-8 s to lower each, 30 against 16 ms an inference)."""
    path = _dynamic_quantized_cnn(tmp_path, width)
    result = forgekit.from_onnx(str(path)).compile(target="host", output_path=tmp_path / "a", opt_level=3,
                                                   export_metadata=True)
    rules = json.loads((result.path / "compile_report.json").read_text())["schedule_rules"]
    convs = {k: r for k, r in rules.items() if "conv2d" in k or "winograd_output" in k}
    # the three convs with their epilogues (beside them: the zero-point corrections' small convs); without VNNI
    # the 32 -> 32 one runs fp32 F(4x4) Winograd, its epilogue fused into the output transform
    layers = {k: r for k, r in convs.items() if "sigmoid" in k}
    assert len(layers) == 3 and all(r in ("conv2d", "gemm_int8_vnni", "gemm_int8_sdot", "gemm_int8_avx2", "winograd")
                                 for r in layers.values()), rules  # was "pool"
    assert not any("floor" in k for k in convs), rules  # the bias chain is a kernel of its own
    engine = Engine(result.path)
    for seed, size in ((1, 40), (2, 40 if width == 40 else 57)):
        x = np.random.default_rng(seed).random((1, 3, 24, size)).astype(np.float32)
        got, expected = engine.infer(x)[0], ort_run(path, {"x": x})[0]
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_the_run_time_ranges_reduce_rows_first(tmp_path: Path) -> None:
    """DynamicQuantizeLinear's min/max over a whole activation: a row reduction first (the pool rule:
    vectorized, threaded), then a short one; straight to a scalar they took the fallback schedule (one thread,
    scalar: 1.5 ms of the quantized CRNN's 8)."""
    path = _dynamic_quantized_cnn(tmp_path)
    result = forgekit.from_onnx(str(path)).compile(target="host", output_path=tmp_path / "a", opt_level=3,
                                                   export_metadata=True)
    rules = json.loads((result.path / "compile_report.json").read_text())["schedule_rules"]
    ranges = [r for k, r in rules.items() if k.rstrip("0123456789") in ("max", "min")]
    assert ranges.count("pool") == 6, rules  # 3 layers x (min, max) over rows; before: 6 x fallback only
