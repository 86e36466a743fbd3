"""The TIDL offload plan (TI's partitioning with TIDL's per-device operator rules), the CLI's --offload tidl, and
the driver's refusals where TI's tools are absent (they are licensed downloads: never here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from forgekit.errors import UsageError
from forgekit.offload import tidl_driver
from forgekit.offload.tidl import plan_tidl

from conftest import run_cli

REPO = Path(__file__).resolve().parents[2]
PPOCR_DET = REPO / ".venv/lib/python3.11/site-packages/rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"


def _model(nodes, inits, x_shape, outputs, opset=17):
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                              [numpy_helper.from_array(v.astype(np.float32) if v.dtype.kind == "f" else v, k)
                               for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def small_model() -> onnx.ModelProto:
    """conv1 relu1 | pool5 (5x5: not TIDL) | conv2 sig mul conv3 | softmax over channels (not TIDL), + a
    constant shape computed by Constant -> Reshape of a constant (folded)."""
    rng = np.random.default_rng(0)
    inits = {"w1": rng.standard_normal((8, 3, 3, 3)), "w2": rng.standard_normal((8, 8, 3, 3)),
             "w3": rng.standard_normal((4, 8, 1, 1)), "flat": np.arange(4, dtype=np.float32)}
    n = helper.make_node
    nodes = [
        n("Constant", [], ["shape4"], value=numpy_helper.from_array(np.array([1, 4, 1, 1], np.int64)), name="const"),
        n("Reshape", ["flat", "shape4"], ["bias4"], name="bias_reshape"),
        n("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"), n("Relu", ["c1"], ["r1"], name="relu1"),
        n("MaxPool", ["r1"], ["p"], kernel_shape=[5, 5], pads=[2, 2, 2, 2], name="pool5"),
        n("Conv", ["p", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv2"),
        n("Sigmoid", ["c2"], ["s2"], name="sig"), n("Mul", ["c2", "s2"], ["m2"], name="mul"),
        n("Conv", ["m2", "w3"], ["c3"], name="conv3"), n("Add", ["c3", "bias4"], ["a3"], name="add"),
        n("Softmax", ["a3"], ["y"], axis=1, name="softmax"),
    ]
    return _model(nodes, inits, [1, 3, 32, 32], ["y"])


def yolo_like(seed: int = 0) -> onnx.ModelProto:
    """A YOLO-style detector in miniature: SiLU conv backbone, SPPF (three 5x5 max pools), a 2x nearest
    upsample + concat neck, a head reshaped to (1, 3, 6, H, W) -> permuted, sigmoid, box decoding with a
    constant grid, and a ReduceMax over classes for scores."""
    rng = np.random.default_rng(seed)
    w = lambda *s: rng.standard_normal(s) * (1 / np.sqrt(np.prod(s[1:])))  # noqa: E731
    inits = {"w0": w(16, 3, 3, 3), "w1": w(32, 16, 3, 3), "w2": w(16, 32, 1, 1), "w3": w(32, 64, 1, 1),
             "w4": w(16, 48, 3, 3), "wh": w(18, 16, 1, 1), "scales": np.array([1, 1, 2, 2], np.float32),
             "hshape": np.array([1, 3, 6, 16, 16], np.int64), "two": np.array(2.0, np.float32),
             "half": np.array(0.5, np.float32), "grid": rng.standard_normal((1, 3, 16, 16, 2)),
             "s0": np.array([0], np.int64), "s2": np.array([2], np.int64), "s4": np.array([4], np.int64),
             "s6": np.array([6], np.int64), "ax": np.array([4], np.int64), "rmax_axes": np.array([4], np.int64)}
    n = helper.make_node

    def conv_silu(x, wname, out, stride=1, k=3):
        return [n("Conv", [x, wname], [f"{out}_c"], pads=[k // 2] * 4, strides=[stride] * 2, name=f"{out}_conv"),
                n("Sigmoid", [f"{out}_c"], [f"{out}_s"], name=f"{out}_sig"),
                n("Mul", [f"{out}_c", f"{out}_s"], [out], name=f"{out}_silu")]

    nodes = [*conv_silu("x", "w0", "b0", 2), *conv_silu("b0", "w1", "b1", 2), *conv_silu("b1", "w2", "sp", 1, 1),
             n("MaxPool", ["sp"], ["m1"], kernel_shape=[5, 5], pads=[2] * 4, name="sppf_pool1"),
             n("MaxPool", ["m1"], ["m2"], kernel_shape=[5, 5], pads=[2] * 4, name="sppf_pool2"),
             n("MaxPool", ["m2"], ["m3"], kernel_shape=[5, 5], pads=[2] * 4, name="sppf_pool3"),
             n("Concat", ["sp", "m1", "m2", "m3"], ["cat"], axis=1, name="sppf_cat"),
             *conv_silu("cat", "w3", "sppf", 1, 1),
             n("Resize", ["sppf", "", "scales"], ["up"], mode="nearest", name="upsample"),
             n("Concat", ["up", "b0"], ["neck"], axis=1, name="neck_cat"),
             *conv_silu("neck", "w4", "n1", 1),
             n("Conv", ["n1", "wh"], ["head"], name="head_conv"),
             n("Reshape", ["head", "hshape"], ["h5"], name="head_reshape"),
             n("Transpose", ["h5"], ["ht"], perm=[0, 1, 3, 4, 2], name="head_permute"),
             n("Sigmoid", ["ht"], ["hs"], name="head_sigmoid"),
             n("Slice", ["hs", "s0", "s2", "ax"], ["xy0"], name="xy_slice"),
             n("Mul", ["xy0", "two"], ["xy1"], name="xy_mul"), n("Sub", ["xy1", "half"], ["xy2"], name="xy_sub"),
             n("Add", ["xy2", "grid"], ["xy"], name="xy_grid"),
             n("Slice", ["hs", "s2", "s4", "ax"], ["wh"], name="wh_slice"),
             n("Slice", ["hs", "s4", "s6", "ax"], ["cls"], name="cls_slice"),
             n("Concat", ["xy", "wh", "cls"], ["boxes"], axis=-1, name="boxes_cat"),
             n("ReduceMax", ["cls", "rmax_axes"], ["scores"], keepdims=0, name="scores")]
    return _model(nodes, inits, [1, 3, 64, 64], ["boxes", "scores"], opset=18)


def test_plan_pins_partition_reasons_and_macs_on_a_small_model() -> None:
    plan = plan_tidl(small_model(), "ti/am68a")
    where = {n.name: n.subgraph for n in plan.nodes}
    assert where == {"conv1": 0, "relu1": 0, "pool5": None, "conv2": 1, "sig": 1, "mul": 1, "conv3": 1,
                     "add": 1, "softmax": None}
    why = {n.name: n.reason for n in plan.on_arm}
    assert why["pool5"] == "kernel 5x5 stride 1x1 (TIDL: 1x1, 2x2, 3x3 at stride 1 or 2)"
    assert why["softmax"] == "softmax over axis 1 (TIDL: the last (width) axis)"
    assert plan.subgraph_count == 2 and plan.folded == 2  # the Constant and the Reshape of constants
    macs = {n.name: n.macs for n in plan.nodes if n.macs}
    assert macs == {"conv1": 32 * 32 * 8 * 27, "conv2": 16 * 16 * 8 * 72, "conv3": 16 * 16 * 4 * 8}
    assert plan.macs_share == 1.0 and plan.deny_names() == ["pool5", "softmax"]
    text = "\n".join(plan.summary())
    assert "7 of 9 nodes in 2 subgraph(s), 100.0% of" in text and "1 x MaxPool: kernel 5x5" in text
    doc = plan.to_dict()
    assert doc["subgraph_count"] == 2 and doc["plan"][0] == {"name": "conv1", "op": "Conv", "subgraph": 0,
                                                            "reason": None, "macs": 221184}


def test_deny_allow_lists_and_the_subgraph_limit() -> None:
    denied = plan_tidl(small_model(), "ti/am68a", deny_types=["Relu"], deny_names=["conv3"])
    why = {n.name: n.reason for n in denied.on_arm}
    assert why["relu1"] == "denied by deny_list:layer_type" and why["conv3"] == "denied by deny_list:layer_name"
    assert 0 < denied.macs_share < 1
    allowed = plan_tidl(small_model(), "ti/am68a", allow_names=["conv2", "sig", "mul"])
    assert [n.name for n in allowed.offloaded] == ["conv2", "sig", "mul"] and allowed.subgraph_count == 1
    one = plan_tidl(small_model(), "ti/am68a", max_subgraphs=1)
    assert one.subgraph_count == 1 and "beyond max_num_subgraphs (1)" in {n.name: n.reason for n in one.on_arm}["conv2"]
    with pytest.raises(UsageError, match="1-16"):
        plan_tidl(small_model(), "ti/am68a", max_subgraphs=17)
    with pytest.raises(UsageError, match="C7x/MMA"):
        plan_tidl(small_model(), "ti/am62")  # Arm-only AM62


def test_a_group_fed_only_by_an_earlier_subgraph_joins_it() -> None:
    rng = np.random.default_rng(1)
    n = helper.make_node
    nodes = [n("Conv", ["x", "wa"], ["a"], pads=[1] * 4, name="convA"), n("Erf", ["x"], ["u"], name="erf_side"),
             n("Conv", ["a", "wb"], ["b"], pads=[1] * 4, name="convB"), n("Erf", ["u"], ["u2"], name="erf_side2"),
             n("Add", ["b", "u2"], ["y"], name="join")]
    model = _model(nodes, {"wa": rng.standard_normal((3, 3, 3, 3)), "wb": rng.standard_normal((3, 3, 3, 3))},
                   [1, 3, 8, 8], ["y"])
    plan = plan_tidl(model, "ti/am68a")
    assert {n.name: n.subgraph for n in plan.nodes} == {"convA": 0, "erf_side": None, "convB": 0, "erf_side2": None,
                                                       "join": 1}
    assert {n.reason for n in plan.on_arm} == {"Erf alone (TIDL: only inside a fused GELU)"}


def test_device_differences() -> None:
    n = helper.make_node
    model = _model([n("Conv", ["x", "w"], ["c"], name="conv"), n("DepthToSpace", ["c"], ["y"], blocksize=2, name="d2s")],
                   {"w": np.ones((16, 3, 1, 1))}, [1, 3, 8, 8], ["y"])
    assert plan_tidl(model, "ti/am68a").subgraph_count == 1
    am62a = plan_tidl(model, "ti/am62a")
    assert {n.name: n.reason for n in am62a.on_arm} == {"d2s": "DepthToSpace is not supported on this device"}
    assert "AM62A" in am62a.soc


@pytest.mark.parametrize("target", ["ti/am68a", "ti/am62a"])
def test_yolo_style_plan(target: str) -> None:
    plan = plan_tidl(yolo_like(), target)
    why = {n.name: n.reason for n in plan.on_arm}
    assert set(why) == {"sppf_pool1", "sppf_pool2", "sppf_pool3", "scores"}
    assert why["scores"] == "reduction not over height with keepdims (TIDL: height only)"
    assert plan.subgraph_count == 2 and plan.macs_share == 1.0  # the pools cut the backbone from the neck


@pytest.mark.parametrize("target", ["ti/am68a", "ti/am62a"])
def test_mobilenetv2_and_ppocr_det_plans(target: str) -> None:
    sys.path.insert(0, str(REPO / "bench"))
    from make_models_numpy import mobilenetv2

    mobilenet = plan_tidl(mobilenetv2(), target)
    assert mobilenet.subgraph_count == 1 and len(mobilenet.offloaded) == len(mobilenet.nodes) == 100
    if PPOCR_DET.exists():
        det = plan_tidl(PPOCR_DET, target, {"x": [1, 3, 640, 640]})
        assert det.subgraph_count == 1 and len(det.nodes) == 330 and det.macs_share == 1.0
        assert det.folded == 342  # PaddlePaddle's Constant weights


def test_cli_offload_tidl_writes_the_plan_and_says_what_is_missing(tmp_path: Path) -> None:
    model = tmp_path / "small.onnx"
    onnx.save(small_model(), model)
    env = {k: v for k, v in os.environ.items() if k != "TIDL_TOOLS_PATH"}
    out = subprocess.run([str(Path(sys.executable).parent / "forgekit"), "compile", str(model), "-t", "ti/am62a",
                          "--offload", "tidl", "-o", str(tmp_path / "out")], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "7 of 9 nodes in 2 subgraph(s)" in out.stdout
    missing = [line for line in out.stdout.splitlines() if line.startswith("TIDL import not run")]
    assert len(missing) == 1 and "TIDL_TOOLS_PATH is not set" in missing[0]
    plan = json.loads((tmp_path / "out" / "tidl_plan.json").read_text())
    assert plan["subgraph_count"] == 2 and plan["target"] == "ti/am62a"
    assert (tmp_path / "out" / "model_library.so").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["-t", "raspberry-pi/5", "--offload", "tidl"], "needs a TI board"),
    (["-t", "ti/am62", "--offload", "tidl"], "needs a TI board"),
    (["-t", "ti/am68a", "--offload", "npu"], "Unknown --offload 'npu'"),
])
def test_cli_offload_refusals_are_one_line_and_write_nothing(args: list[str], message: str, tmp_path: Path) -> None:
    model = tmp_path / "small.onnx"
    onnx.save(small_model(), model)
    out = run_cli("compile", str(model), "-o", str(tmp_path / "out"), *args)
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_tools_missing_names_what_is_missing(tmp_path: Path) -> None:
    assert "TIDL_TOOLS_PATH is not set" in tidl_driver.tools_missing({})
    assert "has no tidl_model_import_onnx.so" in tidl_driver.tools_missing({"TIDL_TOOLS_PATH": str(tmp_path)})
    (tmp_path / "tidl_model_import_onnx.so").write_bytes(b"")
    env = {"TIDL_TOOLS_PATH": str(tmp_path), "FORGEKIT_TIDL_PYTHON": sys.executable, "PATH": os.environ["PATH"]}
    assert "no TI onnxruntime with TIDLCompilationProvider" in tidl_driver.tools_missing(env)


def test_import_options_carry_the_plan_and_the_script_refuses_a_plain_onnxruntime(tmp_path: Path) -> None:
    plan = plan_tidl(small_model(), "ti/am68a")
    options = tidl_driver.import_options(plan, "/opt/tidl_tools", str(tmp_path), prequantized=True)
    assert options["deny_list:layer_name"] == "pool5, softmax" and options["max_num_subgraphs"] == 16
    assert options["advanced_options:prequantized_model"] == 1 and options["tensor_bits"] == 8
    model = tmp_path / "small.onnx"
    onnx.save(small_model(), model)
    (tmp_path / "options.json").write_text(json.dumps(options))
    np.savez(tmp_path / "calib.npz", __count__=np.array(1), x__0=np.zeros((1, 3, 32, 32), np.float32))
    script = Path(tidl_driver.__file__).with_name("tidl_import_script.py")
    done = subprocess.run([sys.executable, str(script), str(model), str(tmp_path / "options.json"),
                           str(tmp_path / "calib.npz")], capture_output=True, text=True)
    assert done.returncode == 3 and "no TIDLCompilationProvider" in done.stderr
