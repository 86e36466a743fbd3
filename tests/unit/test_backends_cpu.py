"""Default CPU schedules (forgekit/schedules): every operator pattern compiled at opt_level 3 matches
onnxruntime, and is scheduled by its own rule rather than left unscheduled or to the fallback."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit as forge
from conftest import assert_close, host_dot_kernel, ort_run
from forgekit.runtime import Engine


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "sched", inputs, outputs, initializer=inits)
    for out in graph.output:  # the shape is left for inference to fill in
        out.type.tensor_type.ClearField("shape")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)  # fills the output shapes
    onnx.checker.check_model(inferred)
    return inferred


def _conv_model(cin: int, cout: int, k: int, stride: int, group: int, size: int, pool: str | None = None):
    rng = np.random.default_rng(cin * 100 + cout + k)
    w = (rng.standard_normal((cout, cin // group, k, k)) / np.sqrt(cin // group * k * k)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32) * 0.1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[k // 2] * 4, strides=[stride] * 2, group=group),
             helper.make_node("Clip", ["c", "lo", "hi"], ["y"])]  # ReLU6: the MobileNet epilogue
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
             numpy_helper.from_array(np.array(0, np.float32), "lo"), numpy_helper.from_array(np.array(6, np.float32), "hi")]
    out = "y"
    if pool == "max":
        nodes.append(helper.make_node("MaxPool", ["y"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
        out = "p"
    elif pool == "global":
        nodes.append(helper.make_node("GlobalAveragePool", ["y"], ["p"]))
        out = "p"
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, size, size])],
                  [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits)


def _encoder_block(seq: int = 32, hidden: int = 64, ffn: int = 256):
    """MatMul+bias → Softmax attention → LayerNorm → FFN with Gelu (Erf form): transformer shapes."""
    rng = np.random.default_rng(7)

    def w(*shape):
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32))

    inits = []
    for name, shape in [("wq", (hidden, hidden)), ("wk", (hidden, hidden)), ("w1", (hidden, ffn)), ("w2", (ffn, hidden))]:
        t = w(*shape)
        t.name = name
        inits.append(t)
    inits += [numpy_helper.from_array(rng.standard_normal(ffn).astype(np.float32) * 0.1, "b1"),
              numpy_helper.from_array(np.ones(hidden, np.float32), "g"),
              numpy_helper.from_array(np.zeros(hidden, np.float32), "beta"),
              numpy_helper.from_array(np.array(1 / np.sqrt(hidden), np.float32), "scale"),
              numpy_helper.from_array(np.array(np.sqrt(0.5), np.float32), "rsqrt2"),
              numpy_helper.from_array(np.array(1.0, np.float32), "one"),
              numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"]),
        helper.make_node("MatMul", ["x", "wk"], ["k"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
        helper.make_node("Softmax", ["ss"], ["a"], axis=-1),
        helper.make_node("MatMul", ["a", "x"], ["ctx"]),
        helper.make_node("Add", ["ctx", "x"], ["r"]),
        helper.make_node("LayerNormalization", ["r", "g", "beta"], ["ln"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["ln", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Mul", ["hb", "rsqrt2"], ["hs"]),
        helper.make_node("Erf", ["hs"], ["he"]),
        helper.make_node("Add", ["he", "one"], ["h1"]),
        helper.make_node("Mul", ["hb", "h1"], ["hm"]),
        helper.make_node("Mul", ["hm", "half"], ["gelu"]),
        helper.make_node("MatMul", ["gelu", "w2"], ["y"]),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])], inits)


def _matmul_model(m: int, k: int, n: int, act: str = "Tanh"):
    """x[m,k] @ w[k,n] + b -> act: an RNN step's shape when n is small and not a multiple of the lanes."""
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    inits = [numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["a"]),
             helper.make_node(act, ["a"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


CASES = {
    # name: (model, rules that must appear among the scheduled kernels)
    "conv3x3": (lambda: _conv_model(8, 32, 3, 1, 1, 14), {"conv2d"}),  # the direct kernel: below Winograd
    "conv1x1": (lambda: _conv_model(32, 48, 1, 1, 1, 14), {"conv2d"}),
    "conv_stride2": (lambda: _conv_model(16, 32, 3, 2, 1, 15), {"conv2d"}),
    "conv7x7_stem": (lambda: _conv_model(3, 16, 7, 2, 1, 32, pool="max"), {"conv2d", "pool"}),
    "depthwise": (lambda: _conv_model(32, 32, 3, 1, 32, 14), {"conv2d"}),
    "grouped": (lambda: _conv_model(32, 32, 3, 1, 4, 14, pool="global"), {"conv2d", "pool"}),
    "odd_channels": (lambda: _conv_model(3, 10, 3, 1, 1, 9), {"conv2d"}),
    "encoder": (_encoder_block, {"matmul", "reduction"}),
    # widths that are not multiples of the vector lanes
    "matmul_n3_tanh": (lambda: _matmul_model(2, 3, 3), set()),
    "matmul_n7_sigmoid": (lambda: _matmul_model(5, 9, 7, "Sigmoid"), set()),
    "matmul_n33_relu": (lambda: _matmul_model(3, 17, 33, "Relu"), set()),
}


@pytest.mark.parametrize(("m", "k", "n"), [(2, 3, 3), (2, 4, 5), (3, 16, 16), (4, 12, 33)])
def test_rnn_step_kernel(m, k, n, tmp_path) -> None:
    """tanh(squeeze(h) + x @ w): one RNN step, fused into one kernel whose epilogue reads a second input.

    With n = 3 the 'pool' rule once vectorized the epilogue's loop, which was also the loop around the
    matmul's serial reduction, and TVM lowered that to wrong values (regression test).
    """
    rng = np.random.default_rng(n)
    w = numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]),
             helper.make_node("Squeeze", ["h", "axes"], ["hs"]),
             helper.make_node("Add", ["hs", "mm"], ["a"]),
             helper.make_node("Tanh", ["a"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k]),
                           helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, m, n])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                   [w, numpy_helper.from_array(np.array([0], np.int64), "axes")])
    feeds = {"x": rng.standard_normal((m, k)).astype(np.float32), "h": rng.standard_normal((1, m, n)).astype(np.float32)}
    result = forge.from_onnx(model).compile(target="host", output_path=tmp_path / "step")
    assert_close(Engine(result.path).infer(feeds)[0], ort_run(model, feeds)[0])


@pytest.mark.parametrize("case", sorted(CASES))
def test_pattern_matches_onnxruntime_and_is_scheduled(case, tmp_path) -> None:
    make, wanted = CASES[case]
    model = make()
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    expected = ort_run(model, {"x": x})[0]
    result = forge.from_onnx(model).compile(target="host", output_path=tmp_path / case, export_metadata=True)
    assert_close(Engine(result.path).infer(x)[0], expected)
    report = json.loads((result.path / "compile_report.json").read_text())
    assert "forgekit.CpuSchedules" in report["passes"]
    rules = set(report["schedule_rules"].values())
    assert wanted <= rules, report["schedule_rules"]
    assert "fallback" not in rules, report["schedule_rules"]


def test_lower_levels_do_not_use_the_cpu_schedules(tmp_path) -> None:
    result = forge.from_onnx(_conv_model(8, 8, 3, 1, 1, 8)).compile(
        target="host", output_path=tmp_path / "o2", opt_level=2, export_metadata=True)
    report = json.loads((result.path / "compile_report.json").read_text())
    assert "forgekit.CpuSchedules" not in report["passes"] and report["schedule_rules"] == {}


@pytest.mark.parametrize(("target", "lanes", "arch", "dot"), [
    ({"kind": "llvm", "mcpu": "znver4"}, 16, "x86", "vnni"),
    ({"kind": "llvm", "mcpu": "skylake-avx512"}, 16, "x86", "avx2"),  # no VNNI: vpmaddwd (int8.AVX2)
    ({"kind": "llvm", "mattr": ["+avx512f", "+avx512vnni"]}, 16, "x86", "vnni"),
    ({"kind": "llvm", "mcpu": "haswell"}, 8, "x86", "avx2"),
    ({"kind": "llvm", "mattr": ["+avx2"]}, 8, "x86", "avx2"),
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"], "mcpu": "cortex-a76"}, 4, "arm", "sdot"),
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon", "+dotprod"]}, 4, "arm", "sdot"),
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"], "mcpu": "cortex-a72"}, 4, "arm", ""),
])
def test_target_info_vector_width(target, lanes, arch, dot) -> None:
    import tvm

    from forgekit.targets.isa import isa_info

    info = isa_info(tvm.target.Target(target))
    assert (info.vec_lanes, info.arch, info.dot) == (lanes, arch, dot)
    assert info.acc_budget >= 4


def test_neon_rules_schedule_an_aarch64_build(tmp_path) -> None:
    """The aarch64 path goes through the same rules with 4-lane NEON tiles and links an AArch64 ELF."""
    result = forge.from_onnx(_conv_model(16, 32, 3, 1, 1, 14, pool="max")).compile(
        target="raspberry-pi/5", output_path=tmp_path / "rpi5", export_metadata=True)
    report = json.loads((result.path / "compile_report.json").read_text())
    assert {"conv2d", "pool"} <= set(report["schedule_rules"].values())
    header = result.library.read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183  # EM_AARCH64


def test_conv_transpose_after_nhwc_conv(tmp_path) -> None:
    """Conv (converted to NHWC) feeding ConvTranspose (PP-OCR det's upsampling): the transpose conv stays
    NCHW, the only layout TVM 0.27 can legalize, instead of reaching the VM unlowered."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 4, 3, 3)) / 6).astype(np.float32), "w"),
             numpy_helper.from_array((rng.standard_normal((8, 4, 2, 2)) / 4).astype(np.float32), "wt")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("ConvTranspose", ["r", "wt"], ["u"], strides=[2, 2]),
             helper.make_node("Sigmoid", ["u"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 10, 10])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    x = rng.standard_normal((1, 4, 10, 10)).astype(np.float32)
    result = forge.from_onnx(model).compile(target="host", output_path=tmp_path / "ct", export_metadata=True)
    assert_close(Engine(result.path).infer(x)[0], ort_run(model, {"x": x})[0])
    report = json.loads((result.path / "compile_report.json").read_text())
    assert "conv2d" in set(report["schedule_rules"].values())


def test_squeeze_with_negative_axes_after_nhwc_conv(tmp_path) -> None:
    """Conv -> GlobalAveragePool -> Squeeze(axes=[-1, -2]) (a classifier head as torch's dynamo exporter
    writes it): TVM 0.27's ConvertLayout dies with std::bad_alloc on negative squeeze axes, so forgekit
    makes them positive before the NHWC conversion."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 4, 3, 3)) / 6).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([-1, -2], dtype=np.int64), "axes")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["g"]),
             helper.make_node("Squeeze", ["g", "axes"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 10, 10])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    x = rng.standard_normal((1, 4, 10, 10)).astype(np.float32)
    result = forge.from_onnx(model).compile(target="host", output_path=tmp_path / "sq")
    assert_close(Engine(result.path).infer(x)[0], ort_run(model, {"x": x})[0])


@pytest.mark.parametrize("op", ["Max", "Min", "Mean", "Sum"])
def test_variadic_elementwise_after_nhwc_conv(op, tmp_path) -> None:
    """ONNX Max/Min/Mean/Sum of three operands (one broadcast per channel) after a conv: TVM imports them as
    a reduction over a stacked axis, which ConvertLayout rejects ("Invalid SLayout"); forgekit chains
    binary ops instead."""
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 4, 3, 3)) / 6).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((1, 8, 1, 1)).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node(op, ["c", "r", "b"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 10, 10])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    x = rng.standard_normal((1, 4, 10, 10)).astype(np.float32)
    result = forge.from_onnx(model).compile(target="host", output_path=tmp_path / op)
    assert_close(Engine(result.path).infer(x)[0], ort_run(model, {"x": x})[0])


# ------------------------------------------------------------------ epilogues that do not cover their output
def _matmul_pad(k: int, n: int, rows: int, pad: tuple[int, int]) -> onnx.ModelProto:
    """MatMul then a Pad at the end of its last two axes (by ``pad``): FuseOps makes one kernel of them, whose
    border reads nothing of the matmul (was: garbage there at O3, tests/assets/fuzz/matmul_pad_epilogue_wrong_o3.onnx)."""
    rng = np.random.default_rng(k * n)
    inits = [numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([0, 0, 0, 0, pad[0], pad[1]], np.int64), "pads"),
             numpy_helper.from_array(np.array(-0.41, np.float32), "value")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["k"]),
             helper.make_node("Pad", ["k", "pads", "value"], ["y"], mode="constant")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, k])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


EPILOGUE_CASES = {"7x3 pad (1, 2)": (7, 3, 2, (1, 2)), "24x16 pad (0, 5)": (24, 16, 4, (0, 5)),
                  "64x32 pad (2, 3)": (64, 32, 6, (2, 3))}


@pytest.mark.parametrize("case", sorted(EPILOGUE_CASES))
@pytest.mark.parametrize("level", [3, 4])
def test_matmul_with_an_epilogue_that_does_not_cover_its_output(case, level) -> None:
    from forgekit.backends import cpu

    k, n, rows, pad = EPILOGUE_CASES[case]
    model = _matmul_pad(k, n, rows, pad)
    x = np.random.default_rng(1).standard_normal((1, rows, k)).astype(np.float32)
    cpu.STATS.clear()
    got = forge.from_onnx(model).get_inference_function("host", opt_level=level)(x)
    assert cpu.STATS.get("fused_matmul_pad") == "matmul", cpu.STATS  # one kernel, by the matmul rule
    assert_close(np.asarray(got), ort_run(model, {"x": x})[0])


@pytest.mark.parametrize("case", sorted(EPILOGUE_CASES))
def test_int8_matmul_with_an_epilogue_that_does_not_cover_its_output(case) -> None:
    """The host's int8 kernel (VNNI, or vpmaddwd on AVX2) with the Pad fused after it: the border is the pad value,
    the rest agrees with fp32."""
    from forgekit.backends import cpu

    k, n, rows, pad = EPILOGUE_CASES[case]
    model = _matmul_pad(k, n, rows, pad)
    rng = np.random.default_rng(5)
    ir = forge.from_onnx(model)
    ir.calibrate([rng.standard_normal((1, rows, k)).astype(np.float32) for _ in range(8)])
    ir.quantize(per_channel=True)
    x = rng.standard_normal((1, rows, k)).astype(np.float32)
    cpu.STATS.clear()
    got, ref = np.asarray(ir.get_inference_function("host")(x)), ort_run(model, {"x": x})[0]
    kernel = host_dot_kernel()
    assert kernel is None or kernel.rule in cpu.STATS.values() or n % kernel.lanes, cpu.STATS
    border = np.ones(ref.shape, bool)
    border[:, :rows, :n] = False
    np.testing.assert_array_equal(got[border], ref[border])
    inner, want = got[~border], ref[~border]
    assert float(inner @ want / (np.linalg.norm(inner) * np.linalg.norm(want))) > 0.99
