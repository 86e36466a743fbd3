"""Unary elementwise ops without a layout rule in TVM 0.27 (``relax.nn.leakyrelu``, ``relax.nn.softplus``) keep
the NHWC chain; so do explicit ONNX Pads.

ConvertLayout put each such op back in NCHW between two transposes, and the pooling after it stayed NCHW:
PLCMOS v2 (conv -> LeakyReLU -> MaxPool three times) ran 1.56x onnxruntime's latency, 1.03x with the rule
(one run, 2 threads).  ``forgekit.passes.layout.complete_layout_rules`` gives those ops relu's rule."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper

import forgekit
from forgekit.backends.cpu.pipeline import preprocess
from forgekit.options import OPT_LEVELS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import assert_close, ort_run  # noqa: E402


def _model(act: str, frames: int | str = 12):
    """conv -> act -> MaxPool(1x2) -> conv -> act -> conv (dilated in H, as PLCMOS), NCHW."""
    rng = np.random.default_rng(1)
    inits, nodes, x = [], [], "x"
    for i, (cin, cout) in enumerate([(3, 8), (8, 16), (16, 8)]):
        inits += [numpy_helper.from_array((rng.standard_normal((cout, cin, 3, 3)) * 0.3).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), f"b{i}")]
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1], dilations=[2, 1],
                                      kernel_shape=[3, 3]))
        x = f"c{i}"
        if i < 2:
            attrs = {"alpha": 0.1} if act == "LeakyRelu" else {}
            nodes.append(helper.make_node(act, [x], [f"a{i}"], **attrs))
            x = f"a{i}"
        if i == 0:
            nodes.append(helper.make_node("MaxPool", [x], ["p0"], kernel_shape=[1, 2], strides=[1, 2]))
            x = "p0"
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, frames, 16])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("act", ["LeakyRelu", "Softplus"])
def test_the_activation_stays_nhwc_between_convolutions(act: str) -> None:
    """Only the model's own input and output are transposed (LeakyRelu: 6 transposes without the rule;
    ONNX's Softplus imports as exp/log, which had rules already, and stays a check of the chain)."""
    with tvm.target.Target({"kind": "llvm", "mcpu": "x86-64", "num-cores": 2}):
        mod = preprocess(True)(forgekit.from_onnx(_model(act)).mod)
    assert mod["main"].script().count("R.permute_dims") == 2


@pytest.mark.parametrize("level", OPT_LEVELS)
@pytest.mark.parametrize("act", ["LeakyRelu", "Softplus"])
def test_matches_onnxruntime(act: str, level: int) -> None:
    model = _model(act, frames="F")
    run = forgekit.from_onnx(model).get_inference_function("host", opt_level=level)
    for frames in (9, 20):
        x = np.random.default_rng(frames).standard_normal((1, 3, frames, 16)).astype(np.float32)
        assert_close(np.asarray(run(x)), ort_run(model, {"x": x})[0])


def test_a_1d_transposed_conv_after_1d_convs_stays_ncw() -> None:
    """1-D convs run as NHWC conv2d (passes/conv1d.py); a ConvTranspose 1-D after them was inferred NWC, which
    TVM 0.27 cannot legalize ("CodeGenVM cannot emit this Relax operator directly", fuzz seed 1120)."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 7, 3)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array((rng.standard_normal((8, 4, 3)) * 0.3).astype(np.float32), "wt")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1], kernel_shape=[3]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("ConvTranspose", ["r", "wt"], ["y"], strides=[2], kernel_shape=[3])]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 7, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    run = forgekit.from_onnx(model).get_inference_function("host", opt_level=3)
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 7, 12)).astype(np.float32)
        assert_close(np.asarray(run(x)), ort_run(model, {"x": x})[0])


def _padded_convs(value: float, pads: list[int], size: int | str = 16):
    """conv -> relu -> Pad(``pads``, ``value``) -> conv (stride 2, as tf2onnx writes SAME padding), NCHW."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w0"),
             numpy_helper.from_array((rng.standard_normal((16, 8, 3, 3)) * 0.3).astype(np.float32), "w1"),
             numpy_helper.from_array(np.array(pads, np.int64), "pads"),
             numpy_helper.from_array(np.array(value, np.float32), "value")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Pad", ["r0", "pads", "value"], ["p0"]),
             helper.make_node("Conv", ["p0", "w1"], ["y"], kernel_shape=[3, 3], strides=[2, 2])]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


#: tf2onnx's SAME padding of a stride-2 3x3 conv (the extra row and column after), and a symmetric one
PAD_CASES = {"same_s2": [0, 0, 0, 0, 0, 0, 1, 1], "symmetric": [0, 0, 1, 1, 0, 0, 1, 1]}


@pytest.mark.parametrize("value", [0.0, 0.5])
@pytest.mark.parametrize("case", sorted(PAD_CASES))
def test_an_explicit_pad_stays_nhwc(case: str, value: float) -> None:
    """An ONNX Pad between convolutions imported as an opaque TE call: ConvertLayout moved the tensor back to
    NCHW around it (4 transposes here).  Now a zero pad becomes the next conv's own padding, and any other
    constant pad runs in NHWC; only the model's own input and output are transposed."""
    with tvm.target.Target({"kind": "llvm", "mcpu": "x86-64", "num-cores": 2}):
        mod = preprocess(True)(forgekit.from_onnx(_padded_convs(value, PAD_CASES[case])).mod)
    script = mod["main"].script()
    assert script.count("R.permute_dims") == 2
    assert ("R.nn.pad" in script) == (value != 0.0)


@pytest.mark.parametrize("level", OPT_LEVELS)
@pytest.mark.parametrize("value", [0.0, 0.5])
@pytest.mark.parametrize("case", sorted(PAD_CASES))
def test_explicit_pads_match_onnxruntime(case: str, value: float, level: int) -> None:
    model = _padded_convs(value, PAD_CASES[case], size="S")
    run = forgekit.from_onnx(model).get_inference_function("host", opt_level=level)
    for size in (15, 32):
        x = np.random.default_rng(size).standard_normal((1, 3, size, size)).astype(np.float32)
        assert_close(np.asarray(run(x)), ort_run(model, {"x": x})[0])


def _conv_then_norm(spatial: list, axis: int, channels: int = 4):
    """Conv (1-D or 2-D, as many dims as ``spatial``) -> LayerNormalization from ``axis`` on, its weights of
    the normalized shape (random, so a weight read at the wrong index shows)."""
    rng = np.random.default_rng(len(spatial) * 10 + axis)
    k = [3] * len(spatial)
    shape = [1, channels, *spatial]
    normalized = shape[axis:]
    inits = [numpy_helper.from_array((rng.standard_normal((channels, channels, *k)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(normalized).astype(np.float32), "g"),
             numpy_helper.from_array(rng.standard_normal(normalized).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=k, pads=[1] * (2 * len(spatial))),
             helper.make_node("LayerNormalization", ["c", "g", "b"], ["y"], axis=axis, epsilon=1e-3)]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), shape


NORM_CASES = {  # name: (spatial dims, axis): the normalized axes, and whether NHWC reorders them
    "over [C, W] of NCW, W > C (fuzz seed 4048: read past the weights)": ([16], -2),
    "over [C, W] of NCW, W < C": ([3], -2),
    "over [C, H, W] of NCHW": ([5, 6], 1),
    "over [H, W] of NCHW (order kept)": ([5, 6], 2),
}


@pytest.mark.parametrize("level", OPT_LEVELS)
@pytest.mark.parametrize("case", sorted(NORM_CASES))
def test_a_norm_over_axes_the_layout_reorders_matches_onnxruntime(case: str, level: int) -> None:
    """The class: a LayerNormalization over two or more axes after a conv, whose axes NHWC reorders (channels and
    a spatial axis).  ConvertLayout kept the weights in the old order while the legalization read them in the new
    one (``passes.layout.sorted_norm_axes_pass``): values up to 1e34 at level 3.  Every level must match
    onnxruntime, and after the layout change the norm's axes are ascending."""
    spatial, axis = NORM_CASES[case]
    model, shape = _conv_then_norm(spatial, axis)
    if level == OPT_LEVELS[-1]:
        script = preprocess(True)(forgekit.from_onnx(model).mod)["main"].script()
        assert "R.nn.layer_norm" in script and "axes=[2, 1]" not in script and "axes=[3, 1, 2]" not in script
    run = forgekit.from_onnx(model).get_inference_function("host", opt_level=level)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    assert_close(np.asarray(run(x)), ort_run(model, {"x": x})[0])
