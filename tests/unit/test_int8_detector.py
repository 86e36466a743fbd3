"""int8 on YOLOv8-style detector pieces (bench/yolo_style.py): what the quantizer does with them, checked by
real compiles against onnxruntime fp32 (cosine) on tiny models built here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit
from conftest import GUARDED_BUFFER
from forgekit.quantize import MIN_INT8_OUT_CHANNELS, graph, narrow_ops


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _model(nodes: list, inits: dict[str, np.ndarray], out_shape: list[int], size: int = 16) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                          [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _conv_silu(name: str, x: str, w: str, b: str, **attrs) -> list:
    return [helper.make_node("Conv", [x, w, b], [f"{name}_c"], **attrs),
            helper.make_node("Sigmoid", [f"{name}_c"], [f"{name}_s"]),
            helper.make_node("Mul", [f"{name}_c", f"{name}_s"], [name])]


def make_dfl(seed: int = 0, size: int = 16) -> onnx.ModelProto:
    """conv3x3/s2(3->16)+SiLU -> conv1x1(16->64) -> DFL: reshape [1, 4, 16, A], transpose to [1, 16, 4, A],
    softmax over the 16 bins, fixed 1x1 conv 16->1 (weights 0..15: the expected bin) -> [1, 4, A]."""
    rng = np.random.default_rng(seed)
    a = (size // 2) ** 2
    inits = {"w1": rng.standard_normal((16, 3, 3, 3)) * 0.4, "b1": rng.standard_normal(16) * 0.1,
             "w2": rng.standard_normal((64, 16, 1, 1)) * 0.5, "b2": rng.standard_normal(64) * 0.1,
             "wdfl": np.arange(16, dtype=np.float32).reshape(1, 16, 1, 1),
             "s1": np.array([1, 4, 16, a]), "s2": np.array([1, 4, a])}
    nodes = [*_conv_silu("h", "images", "w1", "b1", pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Conv", ["h", "w2", "b2"], ["box"]),
             helper.make_node("Reshape", ["box", "s1"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Softmax", ["t"], ["p"], axis=1),
             helper.make_node("Conv", ["p", "wdfl"], ["e"]),
             helper.make_node("Reshape", ["e", "s2"], ["y"])]
    m = _model(nodes, inits, [1, 4, a], size)
    # Reshape's shapes must be int64 initializers
    for init in m.graph.initializer:
        if init.name in ("s1", "s2"):
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.int64), init.name))
    return m


def _images(n: int, seed: int, size: int = 16) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.random((1, 3, size, size), dtype=np.float32) for _ in range(n)]


def _ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"images": x})[0]


def test_narrow_output_convs_stay_fp32(tmp_path) -> None:
    """The DFL's 16->1 conv would pad its one output channel to 16 int32 lanes and round the softmax
    probabilities to 1/127 steps: it stays fp32 (listed in fp32_ops), the wide convs go int8, and the
    expected bins stay within 0.25 bin of onnxruntime's (measured: 0.076 with the DFL conv fp32, 0.70 int8)."""
    model = make_dfl()
    ir = forgekit.from_onnx(model)
    ops = graph.describe(ir.mod["main"])
    narrow = narrow_ops(ir.mod["main"])
    assert [ops[i].weight_shape[0] for i in sorted(narrow)] == [1] and MIN_INT8_OUT_CHANNELS > 1
    ir.calibrate(_images(8, 0))
    ir.quantize(per_channel=True, calib_method="percentile", quant_type="static")
    info = ir.quantization
    assert info["quantized_ops"] == 2 and info["fp32_ops"] == [ops[i].name for i in sorted(narrow)]
    assert ir.mod.script().count('out_dtype="int32"') == 2
    f = ir.get_inference_function("host")
    for x in _images(3, 5):
        y, ref = f(x), _ort(model, x)
        assert cosine(y, ref) > 0.999 and np.abs(y - ref).max() < 0.25


def _conv1x1_module(x: np.ndarray, w: np.ndarray, padding: int):
    from tvm import relax

    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, str(x.dtype)))
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.conv2d(xv, relax.const(w), padding=padding, out_dtype="int32"))
        bb.emit_func_output(y)
    return bb.get()


@pytest.mark.parametrize(("x_dtype", "padding", "copies"), [("uint8", 0, False), ("uint8", 1, True), ("int8", 0, True)])
def test_int8_conv_reads_unpadded_unshifted_input_in_place(x_dtype, padding, copies) -> None:
    """VNNI wants uint8 data: a uint8 conv without padding (channels a multiple of 4) reads its activation
    where it lies instead of first copying it into a padded/shifted staging buffer; with padding, or int8
    data (+128), the staging copy stays.  Exact against numpy either way."""
    import tvm
    from tvm import relax

    from forgekit.backends import cpu as schedules
    from forgekit.backends.cpu.int8 import has_vnni
    from forgekit.targets import parse_target

    rng = np.random.default_rng(0)
    lo, hi = (-128, 128) if x_dtype == "int8" else (0, 256)
    x = rng.integers(lo, hi, (1, 8, 6, 7)).astype(x_dtype)
    w = rng.integers(-127, 128, (32, 8, 1, 1)).astype(np.int8)
    mod = _conv1x1_module(x, w, padding)
    target = tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver4", "num-cores": 2})
    lowered = schedules.cpu_pipeline(target)(mod)
    assert ("data_u8" in lowered.script()) == copies
    schedules.STATS.clear()
    ex = tvm.compile(mod, target=target, relax_pipeline=schedules.cpu_pipeline(target))
    assert "gemm_int8_vnni" in schedules.STATS.values()
    if not has_vnni(parse_target("host").tvm_target()):
        pytest.skip("this CPU has no AVX512-VNNI: checked the lowered module only")
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    ref = np.einsum("oc,nchw->nohw", w[:, :, 0, 0].astype(np.int64), xp)
    np.testing.assert_array_equal(out, ref.astype(np.int32))


def make_c2f(seed: int = 1, size: int = 16) -> onnx.ModelProto:
    """YOLOv8's C2f: conv1x1(3->32)+SiLU, Split into halves, a 3x3 conv+SiLU on the second half,
    Concat(first, second, bottleneck) -> conv1x1(48->16)+SiLU."""
    rng = np.random.default_rng(seed)
    inits = {"w1": rng.standard_normal((32, 3, 1, 1)) * 0.5, "b1": rng.standard_normal(32) * 0.1,
             "w2": rng.standard_normal((16, 16, 3, 3)) * 0.1, "b2": rng.standard_normal(16) * 0.1,
             "w3": rng.standard_normal((16, 48, 1, 1)) * 0.2, "b3": rng.standard_normal(16) * 0.1,
             "sp": np.array([16, 16])}
    nodes = [*_conv_silu("a", "images", "w1", "b1"),
             helper.make_node("Split", ["a", "sp"], ["y0", "y1"], axis=1),
             *_conv_silu("m", "y1", "w2", "b2", pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["y0", "y1", "m"], ["cat"], axis=1),
             *_conv_silu("y", "cat", "w3", "b3")]
    m = _model(nodes, inits, [1, 16, size, size], size)
    for init in m.graph.initializer:
        if init.name == "sp":
            init.CopyFrom(numpy_helper.from_array(np.array([16, 16], np.int64), "sp"))
    return m


def test_split_parts_become_slices_that_fuse_into_requantize(tmp_path) -> None:
    """After quantization a Split's parts only feed requantizes and concats: the split (a kernel that copies
    both fp32 halves) becomes a strided_slice at every use, which FuseOps folds into those kernels, or
    nothing where a concat takes the parts in order; no kernel of the compiled model only slices."""
    model = make_c2f()
    ir = forgekit.from_onnx(model)
    assert "R.split(" in ir.mod.script()
    ir.calibrate(_images(8, 0))
    ir.quantize(per_channel=True, calib_method="percentile", quant_type="static")
    script = ir.mod.script()
    # the bottleneck reads a slice; the concat of both halves in order reads the conv output itself
    assert "R.split(" not in script and script.count("R.strided_slice(") == 1
    art = ir.compile(target="host", output_path=tmp_path / "c2f", export_metadata=True)
    kernels = json.loads((Path(art.path) / "compile_report.json").read_text())["schedule_rules"]
    assert not [k for k in kernels if k.startswith("split") or k.startswith("strided_slice")], kernels
    f = ir.get_inference_function("host")
    for x in _images(3, 5):
        assert cosine(f(x), _ort(model, x)) > 0.999


_GUARDED = GUARDED_BUFFER + r'''
import sys
import tvm
from tvm import relax
from forgekit.backends import cpu

dtype = sys.argv[1]
shape = (1, 16, 16, 16)  # NHWC int8: 4 KiB, whole pages
x_np = guarded(shape, dtype)
rng = np.random.default_rng(0)
lo, hi = (-128, 128) if dtype == "int8" else (0, 256)
x_np[...] = rng.integers(lo, hi, shape)
w = rng.integers(-127, 128, (3, 3, 16, 32)).astype("int8")
bb = relax.BlockBuilder()
x = relax.Var("x", relax.TensorType(shape, dtype))
with bb.function("main", [x]):
    with bb.dataflow():  # NHWC on the input itself: the int8 prologue reads the guarded buffer
        y = bb.emit_output(relax.op.nn.conv2d(x, relax.const(w), padding=[1, 1], data_layout="NHWC",
                                              kernel_layout="HWIO", out_dtype="int32"))
    bb.emit_func_output(y)
target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})
ex = tvm.compile(bb.get(), target=target, relax_pipeline=cpu.cpu_pipeline(target))
xt = tvm.runtime.from_dlpack(x_np)
out = relax.VirtualMachine(ex, tvm.cpu())["main"](xt).numpy()
ref = np.zeros((1, 16, 16, 32), np.int64)
xp = np.pad(x_np.astype(np.int64), ((0, 0), (1, 1), (1, 1), (0, 0)))
for i in range(3):
    for j in range(3):
        ref += np.einsum("nhwc,co->nhwo", xp[:, i:i + 16, j:j + 16], w[i, j].astype(np.int64))
print("exact", bool((out == ref).all()))
sys.exit(0 if (out == ref).all() else 3)
'''


@pytest.mark.parametrize("x_dtype", ["int8", "uint8"])
def test_padded_int8_prologue_reads_only_its_input(tmp_path, x_dtype) -> None:
    """The padding/shift prologue of the VNNI conv must not load outside its input: with Select, TVM drops
    the index clamps under the condition and still evaluates the load (the bf16 prologue segfaulted on
    PP-OCRv4 det this way).  The input sits between two PROT_NONE pages: such a load kills the child."""
    import subprocess
    import sys

    from forgekit.backends.cpu.int8 import has_vnni
    from forgekit.targets import parse_target

    if not has_vnni(parse_target("host").tvm_target()):
        pytest.skip("this CPU has no AVX512-VNNI")
    script = tmp_path / "guarded.py"
    script.write_text(_GUARDED)
    proc = subprocess.run([sys.executable, str(script), x_dtype], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "exact True" in proc.stdout
