"""1-D convolutions run as 2-D ones of height 1 (forgekit/passes/conv1d.py, phase 2 of the CPU pipeline): every
stride, dilation, padding (asymmetric too), group count (depthwise too) and kernel size (1 to 256), with bias and
ReLU epilogues, batch norm, PReLU and pooling between them and a symbolic length, against onnxruntime at opt
levels 1-4, in bf16 and as an integer (ConvInteger) conv on the VNNI kernels.  Without the pass 10 of these 12
tests fail (a conv1d kernel left, a stack not 4-D, bf16/int8 builds off the bf16/VNNI rules); the comparisons at
levels 1-2, which TVM's own pipeline builds, pass either way.

Silero VAD v6 (``input`` 64x576), 2 threads of this Zen 4: forgekit / OpenVINO f32 1.71x -> 0.63x, forgekit /
onnxruntime 0.68x -> 0.26x; the measurements are in the pass's docstring.
"""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit as forge
from conftest import assert_close, ort_run
from forgekit.runtime import Engine
from forgekit.runtime.cpu import host_arch, host_features

needs_bf16 = pytest.mark.skipif("avx512bf16" not in host_features() or host_arch() != "x86_64",
                                reason="this CPU has no AVX512_BF16: bf16 artifacts compile but cannot run here")

#: name, Conv attributes, output channels, bias + ReLU after: each a branch of :func:`branches` on a 16-channel input
CASES = [
    ("same3", dict(kernel_shape=[3], pads=[1, 1]), 24, True),
    ("stride2", dict(kernel_shape=[5], strides=[2], pads=[2, 2]), 32, True),
    ("dilated", dict(kernel_shape=[3], dilations=[2], pads=[2, 2]), 24, False),
    ("asymmetric", dict(kernel_shape=[4], pads=[1, 2]), 24, True),
    ("stride3_dilated_asym", dict(kernel_shape=[3], strides=[3], dilations=[2], pads=[0, 1]), 16, False),
    ("groups4", dict(kernel_shape=[3], pads=[1, 1], group=4), 32, True),
    ("depthwise", dict(kernel_shape=[7], pads=[3, 3], group=16), 16, True),
    ("depthwise_x2", dict(kernel_shape=[5], pads=[2, 2], group=16), 32, False),
    ("pointwise", dict(kernel_shape=[1]), 8, True),
    ("same_upper", dict(kernel_shape=[4], strides=[2], auto_pad="SAME_UPPER"), 24, True),
]
CIN, LENGTH, AUDIO = 16, 50, 832


def _conv(rng, nodes, inits, name, x, cin, cout, bias=True, **attrs):
    group = attrs.get("group", 1)
    k = attrs["kernel_shape"][0]
    w = (rng.standard_normal((cout, cin // group, k)) / np.sqrt(cin // group * k)).astype(np.float32)
    inits.append(numpy_helper.from_array(w, f"{name}_w"))
    inputs = [x, f"{name}_w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32) * 0.1, f"{name}_b"))
        inputs.append(f"{name}_b")
    nodes.append(helper.make_node("Conv", inputs, [name], name=name, **attrs))
    return name


def _model(nodes, inits, inputs, outputs) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "conv1d", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                        for o in outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def branches(length: int | str = LENGTH) -> onnx.ModelProto:
    """One Conv per :data:`CASES` entry on ``x`` [N, 16, length], and an STFT-like 256-tap/stride-128 Conv to
    258 channels on ``audio`` [N, 1, 832] (Silero VAD's first layer), each its own output."""
    rng = np.random.default_rng(0)
    nodes, inits, outputs = [], [], []
    for name, attrs, cout, epilogue in CASES:
        y = _conv(rng, nodes, inits, name, "x", CIN, cout, bias=epilogue, **attrs)
        if epilogue:
            nodes.append(helper.make_node("Relu", [y], [f"{name}_relu"]))
            y = f"{name}_relu"
        outputs.append(y)
    outputs.append(_conv(rng, nodes, inits, "stft", "audio", 1, 258, bias=False, kernel_shape=[256], strides=[128]))
    return _model(nodes, inits, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", CIN, length]),
                                 helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["N", 1, AUDIO])], outputs)


def chain(length: int | str = LENGTH) -> onnx.ModelProto:
    """A small 1-D encoder: conv+BN+ReLU, a residual block, MaxPool, a strided depthwise-separable pair, a
    PReLU, AveragePool, a gated unit, squeeze-and-excitation, a 1x1 head with a sigmoid: the layers VAD,
    keyword-spotting and speaker-embedding nets stack."""
    rng = np.random.default_rng(1)
    nodes, inits = [], []
    c = 32

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    y = _conv(rng, nodes, inits, "c1", "x", CIN, c, kernel_shape=[3], pads=[1, 1])
    bn = [const(f"bn_{k}", v) for k, v in (("s", rng.uniform(0.5, 1.5, c)), ("b", rng.standard_normal(c) * 0.1),
                                            ("m", rng.standard_normal(c) * 0.1), ("v", rng.uniform(0.5, 1.5, c)))]
    nodes += [helper.make_node("BatchNormalization", [y, *bn], ["bn"]), helper.make_node("Relu", ["bn"], ["r1"])]
    y = _conv(rng, nodes, inits, "c2", "r1", c, c, kernel_shape=[3], pads=[1, 1])
    nodes += [helper.make_node("Relu", [y], ["r2"]), helper.make_node("Add", ["r2", "r1"], ["res"]),
              helper.make_node("MaxPool", ["res"], ["pool"], kernel_shape=[2], strides=[2])]
    y = _conv(rng, nodes, inits, "dw", "pool", c, c, kernel_shape=[5], strides=[2], pads=[2, 2], group=c)
    y = _conv(rng, nodes, inits, "pw", y, c, 2 * c, kernel_shape=[1])
    nodes.append(helper.make_node("PRelu", [y, const("slope", rng.uniform(0, 0.3, (2 * c, 1)))], ["pr"]))
    nodes.append(helper.make_node("AveragePool", ["pr"], ["avg"], kernel_shape=[3], strides=[1], pads=[1, 1]))
    # a gated unit (WaveNet's tanh * sigmoid of two convs), then squeeze-and-excitation (ECAPA-TDNN's): a mean
    # over the length, which stays 3-D, scaling the 4-D tensor
    a = _conv(rng, nodes, inits, "ga", "avg", 2 * c, c, kernel_shape=[3], dilations=[2], pads=[2, 2])
    b = _conv(rng, nodes, inits, "gb", "avg", 2 * c, c, kernel_shape=[3], dilations=[2], pads=[2, 2])
    nodes += [helper.make_node("Tanh", [a], ["ta"]), helper.make_node("Sigmoid", [b], ["sb"]),
              helper.make_node("Mul", ["ta", "sb"], ["gated"]),
              helper.make_node("ReduceMean", ["gated"], ["se_mean"], axes=[2], keepdims=1),
              helper.make_node("Sigmoid", ["se_mean"], ["se"]), helper.make_node("Mul", ["gated", "se"], ["excited"])]
    y = _conv(rng, nodes, inits, "head", "excited", c, 1, kernel_shape=[1])
    nodes.append(helper.make_node("Sigmoid", [y], ["prob"]))
    return _model(nodes, inits, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", CIN, length])], ["prob"])


def _feeds(model: onnx.ModelProto, batch: int = 2, length: int = LENGTH, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = {"x": (batch, CIN, length), "audio": (batch, 1, AUDIO)}
    return {i.name: rng.standard_normal(sizes[i.name]).astype(np.float32) for i in model.graph.input}


def _prefix(model: onnx.ModelProto, shapes: dict) -> str:
    """The module after the graph passes and the CPU pipeline's Relax prefix (phase 2), as a level-3 build has it."""
    import tvm

    from forgekit.backends.cpu.pipeline import preprocess
    from forgekit.passes import graph_passes

    passes = tvm.transform.Sequential([*graph_passes(3), preprocess()])
    return passes(forge.from_onnx(model, shape_dict=shapes).mod).script()


def test_every_conv1d_becomes_a_conv2d() -> None:
    model = branches()
    script = _prefix(model, {"x": [2, CIN, LENGTH], "audio": [2, 1, AUDIO]})
    assert "conv1d" not in script
    assert script.count("R.nn.conv2d(") == len(CASES) + 1


def test_a_stack_of_1d_layers_stays_4d_between_convolutions() -> None:
    """The squeeze after each conv sinks through ReLU, the residual add, pooling, PReLU and the gate (the batch
    norm is folded into the conv's weights), and the next conv's expand_dims cancels it: from the first conv to
    the last, no transpose out of NHWC, and two squeezes left: the mean's input (a reduction, 3-D; its result
    gains the unit axis back to scale the 4-D tensor) and the output, transposed to NCW at the end."""
    script = _prefix(chain(), {"x": [2, CIN, LENGTH]})
    assert "conv1d" not in script and "pool1d" not in script and "batch_norm" not in script
    first, last = script.index("R.nn.conv2d("), script.rindex("R.nn.conv2d(")
    assert script.count("R.nn.conv2d(") == 7
    transposed = re.findall(r"R\.Tensor\(\((\d+), (\d+), (\d+), (\d+)\).*= R\.permute_dims\(", script[first:last])
    assert transposed == [("2", "1", "1", "32")], transposed  # the excitation's [N, 1, 1, C]: no data moves
    assert script.count("R.squeeze(") == 2 and script.count("R.expand_dims(") == 2  # the input's, the mean's


def test_channels_last_and_runtime_weights_compute_the_same() -> None:
    """Layouts ONNX never gives (NWC data, WIO kernels) and a weight that is an input, not a constant (an
    expand_dims at run time): the rewritten module computes what the conv1d did (TVM's default build of each)."""
    import tvm
    from tvm import relax

    from forgekit.passes.conv1d import conv1d_as_conv2d

    rng = np.random.default_rng(5)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 20, 8), "float32"))
    w = relax.Var("w", relax.TensorType((8, 12, 3), "float32"))
    wio = rng.standard_normal((3, 4, 12)).astype(np.float32)
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv1d(x, relax.const(wio), strides=2, padding=[1, 2], groups=2,
                                           data_layout="NWC", kernel_layout="WIO"))
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, relax.const(np.ones(12, np.float32)))))
            z = bb.emit(relax.op.nn.conv1d(relax.op.permute_dims(y, [0, 2, 1]), w, dilation=2, padding=[2, 2]))
            out = bb.emit_output(relax.op.nn.max_pool1d(z, pool_size=2, strides=2, ceil_mode=True))
        bb.emit_func_output(out)
    mod = bb.get()
    rewritten = conv1d_as_conv2d(mod)
    assert "conv1d" not in rewritten.script() and "pool1d" not in rewritten.script()
    args = [tvm.runtime.tensor(rng.standard_normal(s).astype(np.float32)) for s in ((2, 20, 8), (8, 12, 3))]

    def run(m):
        return tvm.relax.VirtualMachine(tvm.compile(m, "llvm"), tvm.cpu())["main"](*args).numpy()

    assert_close(run(rewritten), run(mod))


def _run(model: onnx.ModelProto, feeds: dict, **compile_kwargs) -> tuple[list[np.ndarray], dict]:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        result = forge.from_onnx(model).compile(target="host", output_path=Path(tmp) / "a", export_metadata=True,
                                                **compile_kwargs)
        report = json.loads((result.path / "compile_report.json").read_text())
        return Engine(result.path).infer(feeds), report


@pytest.mark.parametrize("opt_level", [1, 2, 3, 4])
def test_branches_match_onnxruntime(opt_level) -> None:
    model = branches()
    feeds = _feeds(model)
    got, report = _run(model, feeds, opt_level=opt_level)
    for name, a, b in zip([o.name for o in model.graph.output], got, ort_run(model, feeds)):
        assert a.shape == b.shape, name
        assert_close(a, b)
    if opt_level >= 3:  # forgekit's schedules: every convolution on the conv2d rule, none left as conv1d
        rules = report["schedule_rules"]
        assert not [k for k in rules if "conv1d" in k], rules
        assert sum(rule == "conv2d" for k, rule in rules.items() if "conv2d" in k) == len(CASES) + 1, rules


def test_chain_matches_onnxruntime_with_fused_epilogues() -> None:
    model = chain()
    feeds = _feeds(model, batch=3)
    got, report = _run(model, feeds)
    assert_close(got[0], ort_run(model, feeds)[0])
    rules = report["schedule_rules"]
    assert not [k for k in rules if "conv1d" in k or "pool1d" in k], rules
    assert [k for k in rules if k.startswith("fused_conv2d") and k.endswith("_relu")], rules


@pytest.mark.parametrize("make", [branches, chain])
def test_symbolic_length_runs_at_two_sizes(make) -> None:
    """One artifact for every length: the expand_dims/squeeze and the conv2d keep the symbolic width."""
    model = make("L")
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        result = forge.from_onnx(model).compile(target="host", output_path=Path(tmp) / "d", export_metadata=True)
        rules = json.loads((result.path / "compile_report.json").read_text())["schedule_rules"]
        assert not [k for k in rules if "conv1d" in k] and "conv2d" in rules.values(), rules
        engine = Engine(result.path)
        for length in (LENGTH, 23):
            feeds = _feeds(model, batch=1, length=length, seed=length)
            for a, b in zip(engine.infer(feeds), ort_run(model, feeds)):
                assert a.shape == b.shape
                assert_close(a, b)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a.ravel(), b.ravel()) / (np.linalg.norm(a) * np.linalg.norm(b)))


@needs_bf16
def test_bf16_builds_run_1d_convolutions_on_bf16_kernels() -> None:
    model = chain()
    feeds = _feeds(model, batch=2)
    (got,), report = _run(model, feeds, set_bfloat16=True)
    assert "gemm_bf16" in report["schedule_rules"].values(), report["schedule_rules"]
    expected = ort_run(model, feeds)[0]
    assert _cosine(got - 0.5, expected - 0.5) >= 0.999  # around the sigmoid's midpoint: not swamped by its offset


@pytest.mark.skipif("avx512vnni" not in host_features() or host_arch() != "x86_64",
                    reason="the int8 conv kernels this checks are the VNNI ones")
def test_integer_1d_convolutions_run_on_int8_kernels() -> None:
    """A ConvInteger on a 1-D uint8 input (constant zero point: the importer's integer conv1d) is the VNNI
    kernel's integer conv2d, exact.  (QDQ 1-D Convs, and forgekit's own int8 conv1d: test_int8_conv1d.py.)"""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.integers(-127, 128, (64, 32, 3)).astype(np.int8), "w"),
             numpy_helper.from_array(np.array(128, np.uint8), "zp")]
    nodes = [helper.make_node("ConvInteger", ["x", "w", "zp"], ["acc"], pads=[1, 2], strides=[2]),
             helper.make_node("Cast", ["acc"], ["y"], to=TensorProto.FLOAT)]
    model = _model(nodes, inits, [helper.make_tensor_value_info("x", TensorProto.UINT8, ["N", 32, 41])], ["y"])
    x = rng.integers(0, 256, (2, 32, 41)).astype(np.uint8)
    (got,), report = _run(model, {"x": x})
    rules = report["schedule_rules"]
    assert "gemm_int8_vnni" in rules.values() and not [k for k in rules if "conv1d" in k], rules
    np.testing.assert_array_equal(got, ort_run(model, {"x": x})[0])
