"""Dynamic image sizes (a detector's H and W left to run time), on tiny models built here (issue 39).

Three failure classes a dynamic-size PP-OCRv6 det showed, each a model shape any detector has:

* a stride-2 ConvTranspose (a DB head's upsampling) made TVM's ConvertLayout fail on the whole model, which
  then stayed NCHW on TVM's stock kernels: 1353 ms against onnxruntime's 48 (its static twin: 48 ms);
* the convs of a dynamic height ran on one thread: parallel over the output-channel blocks alone (1.5-1.9x
  their static twins);
* an int8 SE block (a global mean over the image, requantized for its 1x1 conv) failed to compile;
* calibrating a model with a stepped dimension (``H=32..2048:32``) whose feature-map size feeds a kernel as a
  shape argument (YOLOv8's anchor grid: ``Range`` over the coarse map's width) failed inside TVM's FuseTIR.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit


def _model(nodes: list, inits: dict[str, np.ndarray], h: str | int, w: str | int) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, h, w])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _weights(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def db_head(h: str | int = "H", w: str | int = "W") -> onnx.ModelProto:
    """Conv 3x3/2 (3->16) + Relu, ConvTranspose 2x2/2 (16->8) + Relu, ConvTranspose 2x2/2 (8->1) + Sigmoid:
    a probability map (at twice the input's size here) as PP-OCR's DB head makes it."""
    rng = np.random.default_rng(0)
    inits = {"w0": _weights(rng, 16, 3, 3, 3), "t1": _weights(rng, 16, 8, 2, 2), "t2": _weights(rng, 8, 1, 2, 2)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1] * 4, strides=[2, 2]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("ConvTranspose", ["r0", "t1"], ["c1"], strides=[2, 2]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("ConvTranspose", ["r1", "t2"], ["c2"], strides=[2, 2]),
             helper.make_node("Sigmoid", ["c2"], ["y"])]
    return _model(nodes, inits, h, w)


def se_block(h: str | int = "H", w: str | int = "W") -> onnx.ModelProto:
    """Conv 3x3/2 (3->32) + Relu, squeeze-excite (GlobalAveragePool, 1x1 32->8, Relu, 1x1 8->32,
    HardSigmoid, Mul), Conv 3x3 (32->32)."""
    rng = np.random.default_rng(1)
    inits = {"w0": _weights(rng, 32, 3, 3, 3), "s1": _weights(rng, 8, 32, 1, 1), "s2": _weights(rng, 32, 8, 1, 1),
             "w3": _weights(rng, 32, 32, 3, 3)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1] * 4, strides=[2, 2]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("GlobalAveragePool", ["r0"], ["g"]),
             helper.make_node("Conv", ["g", "s1"], ["e1"]), helper.make_node("Relu", ["e1"], ["e2"]),
             helper.make_node("Conv", ["e2", "s2"], ["e3"]), helper.make_node("HardSigmoid", ["e3"], ["e4"]),
             helper.make_node("Mul", ["r0", "e4"], ["m"]),
             helper.make_node("Conv", ["m", "w3"], ["y"], pads=[1] * 4)]
    return _model(nodes, inits, h, w)


def anchor_grid_head(h: str | int = "H", w: str | int = "W") -> onnx.ModelProto:
    """Conv 4x4/4 (3->8) + Relu, Conv 8x8/8 (8->16): a stride-32 map, plus YOLOv8's anchor grid along its width
    (``Range(0, width of the map) + 0.5``, as ``torch.arange(w) + offset`` exports)."""
    rng = np.random.default_rng(6)
    inits = {"w0": _weights(rng, 8, 3, 4, 4), "w1": _weights(rng, 16, 8, 8, 8), "i3": np.array(3, np.int64),
             "zero": np.array(0, np.float32), "one": np.array(1, np.float32), "half": np.array(0.5, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], strides=[4, 4]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["f"], strides=[8, 8]),
             helper.make_node("Shape", ["f"], ["s"]), helper.make_node("Gather", ["s", "i3"], ["wi"]),
             helper.make_node("Cast", ["wi"], ["wf"], to=TensorProto.FLOAT),
             helper.make_node("Range", ["zero", "wf", "one"], ["gx"]),
             helper.make_node("Add", ["gx", "half"], ["cx"]),
             helper.make_node("Add", ["f", "cx"], ["y"])]
    return _model(nodes, inits, h, w)


def _ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _rules(ir) -> tuple:
    from forgekit.backends import cpu as schedules

    schedules.STATS.clear()
    f = ir.get_inference_function("host")
    return f, dict(schedules.STATS)


@pytest.mark.parametrize("dynamic", [None, {"H": "32..1024:32", "W": "32..1024:32"}], ids=["unbounded", "stepped"])
def test_a_strided_conv_transpose_keeps_a_dynamic_model_nhwc(dynamic) -> None:
    """The stride-2 ConvTranspose's depth-to-space shuffle states its sizes simplified: ConvertLayout re-derives
    them, and ``(8 * H_div32 - 1 + 1) * 2`` rows at the model's output were not its ``16 * H_div32`` ("should
    not rewrite any global-scope Var"): the model stayed NCHW, every conv on TVM's stock loop nest (the
    "reduction" rule here).  Matches onnxruntime at two sizes."""
    model = db_head()
    f, rules = _rules(forgekit.from_onnx(model, dynamic=dynamic))
    convs = {name: rule for name, rule in rules.items() if "conv2d" in name}
    assert convs and all(rule in ("conv2d", "winograd") for rule in convs.values()), convs
    rng = np.random.default_rng(2)
    for hw in ((64, 96), (32, 160)):
        x = rng.standard_normal((1, 3, *hw)).astype(np.float32)
        got, want = np.asarray(f(x)), _ort(model, x)
        assert got.shape == want.shape == (1, 1, 2 * hw[0], 2 * hw[1])
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_dynamic_height_is_the_conv_kernels_parallel_loop() -> None:
    """Scheduled for any x86 CPU (nothing runs): an fp32 conv over a dynamic height is parallel over the height,
    not only over its output-channel blocks (one block of 24 channels: one thread)."""
    import re

    import tvm

    from forgekit.backends.cpu import fusion_passes
    from forgekit.backends.cpu.registry import ApplyRules

    rng = np.random.default_rng(3)
    inits = {"w": _weights(rng, 24, 3, 3, 3)}
    model = _model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 4, strides=[2, 2])], inits, "H", "W")
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})
    with target:
        mod = tvm.transform.Sequential([*fusion_passes(target), ApplyRules(target)])(forgekit.from_onnx(model).mod)
    scripts = [f.script() for gv, f in mod.functions.items() if "conv2d" in gv.name_hint]
    assert len(scripts) == 1
    lines = scripts[0].splitlines()
    at = next(i for i, ln in enumerate(lines) if 'T.sblock("conv2d_nhwc' in ln)
    loops, indent = [], len(lines[at]) - len(lines[at].lstrip())
    for ln in reversed(lines[:at]):  # the loops around the conv's block, innermost first
        if ln.strip().startswith("for ") and len(ln) - len(ln.lstrip()) < indent:
            loops.append(ln.strip())
            indent = len(ln) - len(ln.lstrip())
    parallel = [re.search(r"T\.parallel\((.*)\):", ln) for ln in loops]
    assert any(m and "H" in m.group(1) for m in parallel), loops


@pytest.mark.parametrize("dynamic", [None, {"H": "32..1024", "W": "32..1024"}], ids=["unbounded", "bounded"])
def test_an_int8_squeeze_excite_block_over_a_dynamic_image(dynamic) -> None:
    """The global mean over a bounded dynamic image sums in two stages (passes/long_reductions); its last stage
    takes the pixel count as a scalar argument, which FuseTIR could not merge with the requantize fused after
    it ("VarRemapGet(source) == nullptr", compile exit 6).  Compiles, and matches onnxruntime's fp32 at two
    sizes."""
    model = se_block()
    rng = np.random.default_rng(4)
    ir = forgekit.from_onnx(model, dynamic=dynamic)
    ir.calibrate([rng.standard_normal((1, 3, 48, 64)).astype(np.float32) for _ in range(4)])
    ir.quantize()
    f = ir.get_inference_function("host")
    for hw in ((48, 64), (37, 90)):
        x = rng.standard_normal((1, 3, *hw)).astype(np.float32)
        got, want = np.asarray(f(x)), _ort(model, x)
        assert got.shape == want.shape and _cosine(got, want) >= 0.99


def test_a_calibration_sample_outside_the_dynamic_range_is_one_line() -> None:
    """A calibration sample the dynamic ranges do not admit (a width off the step, a height above the bound) is
    an InputError (exit 9) naming the sample and the fix, as the runtime says for a feed; it was a traceback
    from TVM's VM ("match_cast error ... 641 vs. 640")."""
    from forgekit.errors import InputError

    rng = np.random.default_rng(5)
    cases = {(64, 65): "multiples of 32 only: pad the input to W=96", (2048, 64): "from 32 to 1024"}
    for hw, expected in cases.items():
        ir = forgekit.from_onnx(se_block(), dynamic={"H": "32..1024:32", "W": "32..1024:32"})
        good = rng.standard_normal((1, 3, 64, 64)).astype(np.float32)
        with pytest.raises(InputError) as err:
            ir.calibrate([good, rng.standard_normal((1, 3, *hw)).astype(np.float32)])
        message = str(err.value)
        assert err.value.exit_code == 9 and "\n" not in message
        assert message.startswith("Calibration sample 2:") and expected in message, message


def test_calibrating_a_stepped_size_whose_map_width_is_a_kernel_argument() -> None:
    """Calibration exposes every layer's output (ToNonDataflow, ConvertToDataflow, Normalize), which re-typed
    the ``H_div32 = H // 32`` prologue with its values and moved it into a dataflow block; TVM then wrote
    ``W // 32`` for ``W_div32`` at the anchor grid's call, and FuseTIR refused it ("All shape inputs are
    expected to be single tirx var", compile exit 6: NudeNet, a YOLOv8n, at a dynamic size).  Calibrates,
    reports, compiles, and matches onnxruntime's fp32 at two sizes."""
    model = anchor_grid_head()
    rng = np.random.default_rng(7)
    ir = forgekit.from_onnx(model, dynamic={"H": "32..1024:32", "W": "32..1024:32"})
    ir.calibrate([rng.standard_normal((1, 3, 64, 96)).astype(np.float32) for _ in range(2)])
    ir.quantize()
    report = ir.accuracy_report()
    assert len(report["layers"]) == 2 and report["agreement"] >= 0.99, report
    f = ir.get_inference_function("host")
    for hw in ((64, 96), (128, 64)):
        x = rng.standard_normal((1, 3, *hw)).astype(np.float32)
        got, want = np.asarray(f(x)), _ort(model, x)
        assert got.shape == want.shape == (1, 16, hw[0] // 32, hw[1] // 32)
        assert _cosine(got, want) >= 0.99
