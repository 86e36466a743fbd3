"""int8 1-D convolutions: onnxruntime QDQ models with 1-D (and 3-D) Convs import (forgekit/importer/qdq.py),
and forgekit's own quantizer takes conv1d layers (forgekit/quantize/), which the CPU pipeline then runs as
integer conv2d of height 1 on the dot-product kernels (forgekit/passes/conv1d.py).

Before: the QDQ fusion shaped the dequantize scale and the bias ``[1, -1, 1, 1]``, so a 1-D conv's ``[N, C, L]``
output broadcast to 4-D and the next conv failed to import (a 3-D conv's failed at the Mul); the quantizer only
looked at conv2d and matmul, so a 1-D conv model had nothing to calibrate.

Measured on this shared 2-core Zen 4 (AVX512-VNNI), 2 threads, six conv1d(k=3) + ReLU layers 64 -> 128 -> ... ->
128 channels at length 4000, per-channel static int8, artifacts alternating in one process: fp32 21.8 ms, int8
6.3 ms (median of 15), output cosine 0.9995 on held-out inputs.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit as forge
from conftest import ort_run
from forgekit.runtime import Engine
from forgekit.runtime.cpu import host_arch, host_features

VNNI = "avx512vnni" in host_features() and host_arch() == "x86_64"


def _model(nodes, inits, x_shape, output: str) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "int8_conv1d", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _conv(rng, nodes, inits, name, x, cin, cout, kernel, bias=True, **attrs):
    group = attrs.get("group", 1)
    fan_in = cin // group * int(np.prod(kernel))
    w = (rng.standard_normal((cout, cin // group, *kernel)) * np.sqrt(2 / fan_in)).astype(np.float32)
    inits.append(numpy_helper.from_array(w, f"{name}_w"))
    inputs = [x, f"{name}_w"]
    if bias:
        inits.append(numpy_helper.from_array((rng.standard_normal(cout) * 0.1).astype(np.float32), f"{name}_b"))
        inputs.append(f"{name}_b")
    nodes.append(helper.make_node("Conv", inputs, [name], name=name, **attrs))
    return name


def _artifact(ir, tmp: Path) -> tuple[Engine, dict]:
    """``ir`` compiled for this machine at opt level 3, loaded, and the schedule rule of each kernel."""
    tmp.mkdir(parents=True, exist_ok=True)
    result = ir.compile(target="host", output_path=tmp / "a", opt_level=3, export_metadata=True)
    rules = json.loads((result.path / "compile_report.json").read_text())["schedule_rules"]
    return Engine(result.path), rules


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


# ----------------------------------------------------------------------------- onnxruntime's QDQ models
def _two_convs(rank: int) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    """[1, 8, 50] -> Conv(k=3) -> Relu -> Conv(k=5, stride 2) (``rank`` 1), or the same with 3-D kernels on
    [1, 4, 6, 8, 8] (``rank`` 3)."""
    rng = np.random.default_rng(rank)
    shape = (1, 8, 50) if rank == 1 else (1, 4, 6, 8, 8)
    nodes, inits = [], []
    y = _conv(rng, nodes, inits, "c1", "x", shape[1], 16, [3] * rank, pads=[1] * 2 * rank)
    nodes.append(helper.make_node("Relu", [y], ["r1"]))
    y = _conv(rng, nodes, inits, "c2", "r1", 16, 16, [5] * rank, strides=[2] * rank, pads=[2] * 2 * rank)
    return _model(nodes, inits, list(shape), y), shape


def _ort_qdq(model: onnx.ModelProto, shape, tmp: Path, per_channel: bool, activation: str) -> Path:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(0)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(4)])

        def get_next(self):  # noqa: ANN201
            return next(self.it, None)

    src, dst = tmp / "float.onnx", tmp / "qdq.onnx"
    onnx.save(model, src)
    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                    activation_type=getattr(QuantType, activation), weight_type=QuantType.QInt8)
    return dst


@pytest.mark.parametrize(("rank", "per_channel", "activation"), [
    (1, True, "QInt8"), (1, True, "QUInt8"), (1, False, "QInt8"), (1, False, "QUInt8"), (3, True, "QUInt8")])
def test_ort_qdq_convs_of_any_rank_match_onnxruntime(tmp_path, rank, per_channel, activation) -> None:
    """The QDQ pairs fuse onto ConvInteger with the scale and bias shaped for the conv's own rank; the result is
    onnxruntime's (the same tolerance as the 2-D QDQ test of test_quantize.py), 1-D convs on the VNNI kernels."""
    model, shape = _two_convs(rank)
    path = _ort_qdq(model, shape, tmp_path, per_channel, activation)
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in onnx.load(path).graph.node}
    ir = forge.from_onnx(path)
    assert f"nn.conv{rank}d" in ir.operators and (rank == 2 or "nn.conv2d" not in ir.operators), ir.operators
    engine, rules = _artifact(ir, tmp_path)
    for seed in (5, 6):
        x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        (got,), (expected,) = engine.infer(x), ort_run(path, {"x": x})
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * np.abs(expected).max())
    if rank == 1 and VNNI:
        assert list(rules.values()).count("gemm_int8_vnni") == 2, rules


# ----------------------------------------------------------------------------- forgekit's quantizer
CIN, LENGTH = 16, 400


def _encoder() -> onnx.ModelProto:
    """A 1-D encoder on [1, 16, 400]: conv k=3 + ReLU, conv k=5 stride 2 + ReLU, a depthwise k=7 conv (kept fp32
    by policy) with a residual add, an unpadded 1x1 conv of that signed sum (where uint8 takes a zero point) +
    ReLU, a dilated k=3 head."""
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    y = _conv(rng, nodes, inits, "c1", "x", CIN, 32, [3], pads=[1, 1])
    nodes.append(helper.make_node("Relu", [y], ["r1"]))
    y = _conv(rng, nodes, inits, "c2", "r1", 32, 32, [5], strides=[2], pads=[2, 2])
    nodes.append(helper.make_node("Relu", [y], ["r2"]))
    y = _conv(rng, nodes, inits, "dw", "r2", 32, 32, [7], pads=[3, 3], group=32)
    nodes.append(helper.make_node("Add", [y, "r2"], ["res"]))
    y = _conv(rng, nodes, inits, "pw", "res", 32, 24, [1])
    nodes.append(helper.make_node("Relu", [y], ["r4"]))
    y = _conv(rng, nodes, inits, "head", "r4", 24, 8, [3], dilations=[2], pads=[2, 2])
    return _model(nodes, inits, [1, CIN, LENGTH], y)


def _features(n: int, seed: int) -> list[np.ndarray]:
    """Feature-like inputs: each channel a slow sinusoid of its own frequency, phase and gain, plus noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(LENGTH)
    out = []
    for _ in range(n):
        f, phase, gain = (rng.uniform(*r, (CIN, 1)) for r in ((0.002, 0.05), (0, 2 * np.pi), (0.2, 2.0)))
        out.append((gain * np.sin(2 * np.pi * f * t + phase) + 0.1 * rng.standard_normal((CIN, LENGTH)))[None]
                   .astype(np.float32))
    return out


@pytest.fixture(scope="module")
def encoder_reference():
    model = _encoder()
    held_out = _features(3, seed=11)
    return model, held_out, [ort_run(model, {"x": x})[0] for x in held_out]


@pytest.mark.parametrize(("options", "activation"), [
    (dict(per_channel=True, calib_method="entropy"), "int8"),
    (dict(per_channel=False, activation_dtype="uint8"), "uint8"),
    (dict(per_channel=True, quant_type="dynamic"), "int8"),
])
def test_quantize_takes_conv1d_layers(tmp_path, encoder_reference, options, activation) -> None:
    """Every regular 1-D conv is quantized (the depthwise one stays fp32, as for 2-D), the report lists them as
    int8, the output agrees with fp32 on held-out inputs (cosine >= 0.99) and the int8 layers run on the VNNI
    kernels with no conv1d left."""
    model, held_out, expected = encoder_reference
    ir = forge.from_onnx(model)
    ir.calibrate(_features(8, seed=3))
    ir.quantize(**options)
    q = ir.quantization
    assert [layer["op"] for layer in q["layers"]] == ["conv1d"] * 4, q["layers"]
    assert q["quantized_ops"] == 4 and len(q["fp32_ops"]) == 1  # the depthwise conv
    if options.get("quant_type") != "dynamic":
        assert q["bias_correction"] and q["smoothing"] == 0.75
        dtypes = [(layer["activation_dtype"], layer["activation_zero_point"] != 0) for layer in q["layers"]]
        # uint8 everywhere: a zero point for signed inputs (the padded first conv reads it at the border, the 1x1
        # conv of a signed sum), none for non-negative ones
        assert dtypes == ([("int8", False)] * 4 if activation == "int8" else
                          [("uint8", True), ("uint8", False), ("uint8", True), ("uint8", False)]), dtypes
    report = ir.accuracy_report()
    assert [(layer["op"], layer["precision"]) for layer in report["layers"]] == \
        [("conv1d", "int8")] * 2 + [("conv1d", "float32")] + [("conv1d", "int8")] * 2, report["layers"]
    assert report["outputs"][0]["cosine"] >= 0.99
    engine, rules = _artifact(ir, tmp_path)
    for x, ref in zip(held_out, expected):
        assert _cosine(engine.infer(x)[0], ref) >= 0.99
    assert not [k for k in rules if "conv1d" in k], rules
    if VNNI:
        int8 = [k for k, rule in rules.items() if rule == "gemm_int8_vnni"]
        assert len(int8) == 4, rules


def test_max_accuracy_drop_can_keep_conv1d_layers_in_fp32(encoder_reference) -> None:
    """The budget search ranks and keeps 1-D layers like 2-D ones: a budget of 0 keeps every one in fp32."""
    model, held_out, expected = encoder_reference
    ir = forge.from_onnx(model)
    ir.calibrate(_features(4, seed=3))
    ir.quantize(per_channel=True, max_accuracy_drop=0.0)
    report = ir.quantization_report
    assert {layer["precision"] for layer in report["layers"]} == {"float32"} and report["budget_met"]
    f = ir.get_inference_function("host")
    np.testing.assert_allclose(f(held_out[0]), expected[0], rtol=1e-4, atol=1e-4)


def test_bias_correction_of_a_1d_conv_matches_a_convolution_of_the_mean() -> None:
    """``weight_error_bias`` sums a 1-D kernel window (OIW) as it sums a 2-D one: the output shift of a weight
    error on a constant input, per group."""
    from forgekit.quantize.rewrite import weight_error_bias

    rng = np.random.default_rng(0)
    for groups in (1, 4):
        per_group = 16 // groups
        dw = rng.standard_normal((8, per_group, 5)).astype(np.float32)
        mean = rng.standard_normal(16).astype(np.float32)
        # output o of group g reads input channels g * per_group ... (g + 1) * per_group - 1, each over 5 taps
        expect = [float(np.sum(dw[o].astype(np.float64) * mean[o // (8 // groups) * per_group:][:per_group, None]))
                  for o in range(8)]
        zero = np.zeros_like(dw)
        np.testing.assert_allclose(weight_error_bias(zero, dw, mean, True, groups), expect, rtol=1e-5, atol=1e-5)


def test_int8_conv1d_is_not_slower_than_fp32(tmp_path) -> None:
    """A small 1-D stack (4 x conv k=3 + ReLU, 32 -> 64 channels, length 1000), one process, alternating runs:
    the int8 artifact is at least as fast as the fp32 one (the full-size measurement is in the module docstring)."""
    if not VNNI:
        pytest.skip("the int8 kernels that make this fast are the VNNI ones")
    import time

    rng = np.random.default_rng(0)
    nodes, inits, x, cin = [], [], "x", 32
    for i in range(4):
        y = _conv(rng, nodes, inits, f"c{i}", x, cin, 64, [3], pads=[1, 1])
        nodes.append(helper.make_node("Relu", [y], [f"r{i}"]))
        x, cin = f"r{i}", 64
    model = _model(nodes, inits, [1, 32, 1000], x)
    feeds = [np.sin(np.linspace(0, f, 1000, dtype=np.float32))[None, None] * np.ones((1, 32, 1), np.float32)
             + 0.1 * rng.standard_normal((1, 32, 1000)).astype(np.float32) for f in np.linspace(20, 200, 6)]
    ir = forge.from_onnx(model)
    fp32, _ = _artifact(ir, tmp_path / "fp32")
    ir.calibrate(feeds[:4])
    ir.quantize(per_channel=True)
    int8, rules = _artifact(ir, tmp_path / "int8")
    assert list(rules.values()).count("gemm_int8_vnni") >= 1, rules
    calls = [fp32.prepared_call(feeds[5]), int8.prepared_call(feeds[5])]
    times: list[list[float]] = [[], []]
    for _ in range(3):
        for call in calls:
            call()
    for _ in range(20):
        for call, spent in zip(calls, times):
            start = time.perf_counter()
            call()
            spent.append(time.perf_counter() - start)
    assert min(times[1]) <= min(times[0]), (min(times[0]), min(times[1]))
