"""``ConvInteger`` after ``DynamicQuantizeLinear`` (onnxruntime's ``quantize_dynamic`` on a CNN) with constant
8-bit weights of either signedness and any weight zero point runs on forgekit's int8 conv kernels and matches
onnxruntime exactly.

The fast path took a constant input zero point and int8 weights with a zero zero point only; a run-time input
zero point or uint8 weights with theirs (onnxruntime's default before 1.11, ddddocr's CAPTCHA recognizer) ran
the whole conv in int32 on TVM's stock kernel: 1.42-1.48x onnxruntime on that recognizer."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit
from forgekit.runtime import Engine
from forgekit.runtime.cpu import host_arch, host_features

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import ort_run  # noqa: E402

VNNI = "avx512vnni" in host_features() and host_arch() == "x86_64"
C, M = 16, 32


def _model(w_dtype: str, zp: str, group: int, pads: int, stride: int):
    """y = Cast(ConvInteger(DynamicQuantizeLinear(x), W, x_zp, w_zp)): the quantize_dynamic pattern."""
    rng = np.random.default_rng(group * 7 + pads)
    wshape = (M, C // group, 3, 3)
    if w_dtype == "uint8":
        w = rng.integers(0, 256, wshape).astype(np.uint8)
        zps = {"none": None, "tensor": np.array([121], np.uint8),
               "channel": rng.integers(90, 160, M).astype(np.uint8)}[zp]
    else:
        w = rng.integers(-128, 128, wshape).astype(np.int8)
        zps = {"none": None, "tensor": np.array([-7], np.int8), "channel": rng.integers(-20, 20, M).astype(np.int8)}[zp]
    inits = [numpy_helper.from_array(w, "w")]
    ins = ["q", "w", "qz"]
    if zps is not None:
        inits.append(numpy_helper.from_array(zps, "wz"))
        ins.append("wz")
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "qs", "qz"]),
             helper.make_node("ConvInteger", ins, ["acc"], group=group, pads=[pads] * 4,
                              strides=[stride] * 2),
             helper.make_node("Cast", ["acc"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _reference(model, x: np.ndarray) -> np.ndarray:
    """onnxruntime where it runs the model (its ConvInteger takes a weight zero point per tensor only), else
    the definition in int64 numpy on onnxruntime's own quantized input (its DynamicQuantizeLinear alone)."""
    try:
        return ort_run(model, {"x": x})[0]
    except Exception:  # noqa: BLE001 - onnxruntime: "Non per-tensor quantization is not supported"
        pass
    import onnx

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.node[1:]
    del probe.graph.output[:]
    probe.graph.output.extend([helper.make_tensor_value_info(n, TensorProto.UINT8, None) for n in ("q", "qz")])
    q, qz = ort_run(probe, {"x": x})
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    conv = model.graph.node[1]
    attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
    w = inits["w"].astype(np.int64) - inits["wz"].astype(np.int64).reshape(-1, *[1] * (inits["w"].ndim - 1))
    pad, stride, group = attrs["pads"][0], attrs["strides"][0], attrs["group"]
    xs = np.pad(q.astype(np.int64) - int(qz), [(0, 0), (0, 0), (pad, pad), (pad, pad)])
    ho, wo = (xs.shape[2] - 3) // stride + 1, (xs.shape[3] - 3) // stride + 1
    out = np.zeros((1, M, ho, wo), np.int64)
    per_in, per_out = C // group, M // group
    for m in range(M):
        g = m // per_out
        for i in range(3):
            for j in range(3):
                window = xs[0, g * per_in:(g + 1) * per_in, i:i + stride * ho:stride, j:j + stride * wo:stride]
                out[0, m] += np.tensordot(w[m, :, i, j], window, axes=1)
    return out.astype(np.float32)


@pytest.mark.parametrize("w_dtype", ["uint8", "int8"])
@pytest.mark.parametrize("zp", ["none", "tensor", "channel"])
@pytest.mark.parametrize("group,pads,stride", [(1, 1, 1), (2, 0, 2), (C, 1, 1)], ids=["dense", "grouped", "depthwise"])
def test_matches_onnxruntime_exactly_on_the_int8_kernels(tmp_path: Path, w_dtype: str, zp: str, group: int,
                                                         pads: int, stride: int) -> None:
    model = _model(w_dtype, zp, group, pads, stride)
    result = forgekit.from_onnx(model, dynamic={"H": "8..64", "W": "8..256"}).compile(
        target="host", output_path=tmp_path / "a", opt_level=3, export_metadata=True)
    rules = json.loads((result.path / "compile_report.json").read_text())["schedule_rules"]
    if VNNI and group == 1:  # without the fix: a run-time x_zp or uint8 weights ran TVM's int32 conv
        assert any(r == "gemm_int8_vnni" for r in rules.values()), rules
    engine = Engine(result.path)
    for hw in ((16, 40), (9, 131)):
        x = np.random.default_rng(hw[1]).standard_normal((1, C, *hw)).astype(np.float32)
        np.testing.assert_array_equal(engine.infer(x)[0], _reference(model, x))


def test_a_run_time_quantization_between_two_convs_stays_nhwc(tmp_path: Path) -> None:
    """Conv (float) -> DynamicQuantizeLinear -> ConvInteger: the quantization of the first conv's NHWC output
    was put back in NCHW between two transposes (relax.quantize has no layout rule); it is now NHWC, no
    transpose touches it, and the model still matches onnxruntime."""
    import tvm

    from forgekit.backends.cpu.pipeline import preprocess

    rng = np.random.default_rng(11)
    inits = [numpy_helper.from_array((rng.standard_normal((C, 3, 3, 3)) / 5).astype(np.float32), "wf"),
             numpy_helper.from_array(rng.integers(0, 256, (M, C, 3, 3)).astype(np.uint8), "w"),
             numpy_helper.from_array(np.array([121], np.uint8), "wz")]
    nodes = [helper.make_node("Conv", ["x", "wf"], ["f"], pads=[1] * 4),
             helper.make_node("DynamicQuantizeLinear", ["f"], ["q", "qs", "qz"]),
             helper.make_node("ConvInteger", ["q", "w", "qz", "wz"], ["acc"], pads=[1] * 4),
             helper.make_node("Cast", ["acc"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    ir = forgekit.from_onnx(model, dynamic={"H": "8..64", "W": "8..256"})
    text = preprocess(True)(ir.mod)["main"].script()
    assert "R.quantize(" in text and not any("permute_dims" in ln and '"uint8"' in ln for ln in text.splitlines()), text
    engine = Engine(ir.compile("host", output_path=tmp_path / "a").path)
    for hw in ((16, 40), (9, 131)):
        x = np.random.default_rng(hw[1]).standard_normal((1, 3, *hw)).astype(np.float32)
        # the float conv's last bits may differ from onnxruntime's and move a value across a rounding step
        want = ort_run(model, {"x": x})[0]
        np.testing.assert_allclose(engine.infer(x)[0], want, atol=1e-2 * np.abs(want).max())


@pytest.mark.parametrize("spatial", [1, 3])
def test_one_and_three_dimensional_convs_match_onnxruntime_exactly(tmp_path: Path, spatial: int) -> None:
    """The same identity for a 1-D conv (a quantize_dynamic speech model's) and a 3-D one: uint8 weights with
    their zero point, a run-time input zero point, padding and stride 2."""
    rng = np.random.default_rng(spatial)
    k = [3] * spatial
    inits = [numpy_helper.from_array(rng.integers(0, 256, (M, C, *k)).astype(np.uint8), "w"),
             numpy_helper.from_array(np.array([133], np.uint8), "wz")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "qs", "qz"]),
             helper.make_node("ConvInteger", ["q", "w", "qz", "wz"], ["acc"], pads=[1] * (2 * spatial),
                              strides=[2] * spatial),
             helper.make_node("Cast", ["acc"], ["y"], to=TensorProto.FLOAT)]
    dims = [1, C, *["D", "H", "W"][3 - spatial:]]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    ranges = {"D": "4..16", "H": "4..16", "W": "4..256"}
    engine = Engine(forgekit.from_onnx(model, dynamic={d: ranges[d] for d in dims[2:]}).compile(
        target="host", output_path=tmp_path / "a").path)
    for size in ((9, 131), (6, 17)):  # (D and H, W)
        x = rng.standard_normal((1, C, *([size[0]] * (spatial - 1) + [size[1]]))).astype(np.float32)
        np.testing.assert_array_equal(engine.infer(x)[0], ort_run(model, {"x": x})[0])
