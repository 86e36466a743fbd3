"""Post-training quantization (forgekit/quantize/, forgekit/schedules/int8.py, rules/gemm_int8.py).

Models are built in code and tiny (16x16 images): every compile takes a second or two.  Quantized outputs
are compared with the float model by cosine similarity (>= 0.99) and top-1 agreement; the integer
kernels are compared with numpy exactly.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper

import forgekit
from conftest import host_dot_kernel, ort_run, run_cli
from onnx_models import make_cnn, ort_qdq_cnn, samples
from forgekit.backends.cpu.pipeline import preprocess
from forgekit.errors import InputError, UsageError
from forgekit.quantize import graph
from forgekit.quantize.ranges import CALIB_METHODS, threshold
from forgekit.quantize.stats import TensorStats


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def calibrated():
    ir = forgekit.from_onnx(make_cnn())
    ir.calibrate(samples())
    return ir


@pytest.fixture(scope="module")
def float_outputs(calibrated):
    f = calibrated.get_inference_function("host")
    return [f(x) for x in samples(3, seed=7)]


# ----------------------------------------------------------------------------- statistics and methods
def test_stats_histogram_rebins_without_losing_counts() -> None:
    s = TensorStats()
    s.update(np.linspace(0, 1, 1000, dtype=np.float32))
    s.update(np.full(500, -3.0, np.float32))  # wider range: the first histogram is re-binned
    assert s.hist.sum() == 1500 and s.hist_range >= 3.0
    assert s.min == -3.0 and s.max == 1.0 and s.absmax == 3.0 and not s.non_negative
    assert s.average_absmax == pytest.approx(2.0)


def test_local_snr_counts_what_a_zero_point_clips() -> None:
    """The budget's layer ranking: an asymmetric uint8 range with zero point 64 holds only 191 positive levels,
    so values between 191 and 255 levels are clipped (lower SNR than the same scale without a zero point)."""
    from forgekit.quantize.calibrate import Calibration
    from forgekit.quantize.report import local_snr
    from forgekit.quantize.rewrite import OpPlan

    s = TensorStats()
    s.update(np.linspace(0, 1, 10_000, dtype=np.float32))
    calib = Calibration(ops=[], stats=[s])
    snr = {zp: local_snr(calib, {0: OpPlan(1 / 255, "uint8", False, None, zp)}, 0) for zp in (0, 64)}
    assert snr[0] > 45 and snr[64] < 20  # rounding noise only vs a quarter of the range clipped


def test_methods_clip_outliers_except_minmax() -> None:
    s = TensorStats()
    rng = np.random.default_rng(0)
    x = rng.standard_normal(100_000).astype(np.float32)
    x[0] = 40.0  # one outlier
    s.update(x)
    t = {m: threshold(m, s, 127) for m in CALIB_METHODS}
    assert t["minmax"] == pytest.approx(40.0)
    assert 2.0 < t["percentile"] < 3.0  # 99th percentile of |N(0, 1)| is 2.58
    assert 2.0 < t["entropy"] < 40.0 and t["average"] == pytest.approx(40.0)
    assert threshold("percentile", s, 127, {"percentile": 99.99}) > t["percentile"]
    with pytest.raises(UsageError, match="average, entropy, minmax, percentile"):
        threshold("mse", s, 127)


# ----------------------------------------------------------------------------- static / dynamic
@pytest.mark.parametrize("method", sorted(CALIB_METHODS))
def test_static_per_channel_matches_fp32(calibrated, float_outputs, method) -> None:
    q = calibrated.copy()
    q.quantize(per_channel=True, calib_method=method, quant_type="static")
    assert q.is_quantized and q.precision == "int8" and not calibrated.is_quantized
    text = q.mod.script()
    assert text.count('out_dtype="int32"') == 3  # 2 conv2d + 1 matmul on integers; depthwise stays fp32
    f = q.get_inference_function("host")
    for x, ref in zip(samples(3, seed=7), float_outputs):
        out = f(x)
        assert cosine(out, ref) >= 0.99 and out.argmax() == ref.argmax()
    info = q.quantization
    assert info["quant_type"] == "static" and info["calib_method"] == method and info["per_channel"]
    assert info["quantized_ops"] == 3 and info["calibration_samples"] == 6
    assert info["fp32_ops"] == [graph.describe(calibrated.mod["main"])[2].name] and not info["quantize_depthwise"]


def test_quantize_depthwise_on_request(calibrated, float_outputs) -> None:
    q = calibrated.copy()
    q.quantize(per_channel=True, calib_method="minmax", quant_type="static", quantize_depthwise=True)
    assert q.mod.script().count('out_dtype="int32"') == 4 and q.quantization["fp32_ops"] == []
    f = q.get_inference_function("host")
    for x, ref in zip(samples(3, seed=7), float_outputs):
        assert cosine(f(x), ref) >= 0.99


def test_uint8_activations_for_non_negative_tensors(calibrated, float_outputs) -> None:
    q = calibrated.copy()
    q.quantize(activation_dtype="uint8", calib_method="minmax")
    layers = q.quantization["layers"]
    assert {layer["activation_dtype"] for layer in layers} == {"uint8"}
    # the image input is signed (a zero point inside the range), post-ReLU is not (zero point 0)
    assert layers[0]["activation_zero_point"] > 0 and layers[1]["activation_zero_point"] == 0
    assert q.precision == "uint8"
    assert cosine(q.get_inference_function("host")(samples(1, seed=7)[0]), float_outputs[0]) >= 0.99


def _one_conv(k: int, pads: int, seed: int = 0, outlier: float = 1.0) -> onnx.ModelProto:
    """x[1, 8, 6, 6] -> Conv kxk (8 -> 16, bias) -> y; output channel 0's weights scaled by ``outlier``."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((16, 8, k, k)) * 0.2
    w[0] *= outlier
    inits = [numpy_helper.from_array(w.astype(np.float32), "w"),
             numpy_helper.from_array((rng.standard_normal(16) * 0.1).astype(np.float32), "b")]
    g = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[pads] * 4)], "conv",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 6 + 2 * pads - k + 1,
                                                                                 6 + 2 * pads - k + 1])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model


def _hardswish_like(n: int, seed: int) -> list[np.ndarray]:
    """Mostly positive activations with a small negative tail, as after hardswish (min -0.375)."""
    rng = np.random.default_rng(seed)
    return [np.maximum(rng.standard_normal((1, 8, 6, 6)) * 2 + 1, -0.375).astype(np.float32) for _ in range(n)]


@pytest.mark.parametrize("k,pads", [(1, 0), (3, 1), (3, 2)])
def test_uint8_is_asymmetric_also_where_the_conv_pads(k: int, pads: int) -> None:
    """Issue 39: a padded conv after SiLU/hardswish took symmetric int8 under ``uint8`` (its border had to read
    0.0, and the conv pads q = 0), which is nearly every 3x3 conv of a CNN.  The rewrite now pads with the zero
    point itself: the error halves for padded convs as for 1x1 ones, and a wrong border would show here as a
    large error on the 4 (k=3, pads=2: 8) outer rows and columns."""
    ir = forgekit.from_onnx(_one_conv(k, pads))
    ir.calibrate(_hardswish_like(6, 1))
    x = _hardswish_like(1, 2)[0]
    ref = ir.get_inference_function("host")(x)
    got = {}
    for dtype in ("int8", "uint8"):
        q = ir.copy()
        q.quantize(activation_dtype=dtype, calib_method="minmax", per_channel=True, smoothing=None)
        got[dtype] = q.get_inference_function("host")(x)
        layer = q.quantization["layers"][0]
        if dtype == "uint8":
            assert layer["activation_dtype"] == "uint8" and layer["activation_zero_point"] > 0
            # the zero-point pad runs in NHWC: only the model's input and output are transposed
            with tvm.target.Target({"kind": "llvm", "mcpu": "x86-64", "num-cores": 2}):
                script = preprocess(True)(q.mod)["main"].script()
            assert script.count("R.permute_dims") == 2 and script.count("R.nn.pad") == (1 if pads else 0)
    err = {d: float(np.linalg.norm(v - ref)) for d, v in got.items()}
    assert cosine(got["uint8"], ref) >= 0.9999
    # range [-0.375, max] over 256 levels, not [-max, max]: about half the error, the border included
    assert err["uint8"] < 0.7 * err["int8"]
    border = np.ones(ref.shape[2:], bool)
    border[pads:-pads or None, pads:-pads or None] = False
    if border.any():
        edge = {d: float(np.abs(v - ref)[..., border].max()) for d, v in got.items()}
        assert edge["uint8"] < edge["int8"]


def test_weight_error_bias_matches_a_convolution_of_the_mean() -> None:
    import onnxruntime as ort

    from forgekit.quantize.rewrite import weight_error_bias

    rng = np.random.default_rng(0)
    for groups in (1, 2, 8):
        dw = rng.standard_normal((8, 8 // groups, 3, 3)).astype(np.float32)
        mean = rng.standard_normal(8).astype(np.float32)
        # ORT reference: convolving a constant image of the channel means with the weight error gives the
        # output shift at every interior pixel
        g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], group=groups)], "c",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 1, 1])],
                              [numpy_helper.from_array(dw, "w")])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
        m.ir_version = 8
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        x = np.broadcast_to(mean[None, :, None, None], (1, 8, 3, 3)).astype(np.float32)
        expect = sess.run(None, {"x": x})[0].ravel()
        zero = np.zeros_like(dw)
        np.testing.assert_allclose(weight_error_bias(zero, dw, mean, True, groups), expect, rtol=1e-5, atol=1e-5)
    w = rng.standard_normal((6, 4)).astype(np.float32)  # matmul [K, N]
    np.testing.assert_allclose(weight_error_bias(w, w + 0.5, np.arange(6, dtype=np.float32), False, 1),
                               np.full(4, 0.5 * 15), rtol=1e-6)


def test_bias_correction_removes_the_mean_error() -> None:
    # per-tensor weights sized by one large output channel: the other channels' weights round coarsely,
    # and with positive inputs (log-normal, mean 1.6) their rounding errors shift each output channel
    ir = forgekit.from_onnx(_one_conv(1, 0, seed=3, outlier=8.0))

    def positive(n: int, seed: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [np.exp(rng.standard_normal((1, 8, 6, 6)) * 0.5).astype(np.float32) for _ in range(n)]

    ir.calibrate(positive(8, 1))
    xs = positive(32, 5)
    f = ir.get_inference_function("host")
    refs = [f(x) for x in xs]
    errors = {}
    for on in (True, False):
        q = ir.copy()
        q.quantize(calib_method="minmax", smoothing=None, bias_correction=on)  # per-tensor weights: coarse
        assert q.quantization["bias_correction"] is on
        g = q.get_inference_function("host")
        errors[on] = np.stack([g(x) - r for x, r in zip(xs, refs)])
    # the systematic part (mean over samples and pixels, per output channel) is what the correction removes
    bias = {on: float(np.linalg.norm(e.mean(axis=(0, 2, 3)))) for on, e in errors.items()}
    assert bias[True] < 0.3 * bias[False]
    assert np.linalg.norm(errors[True]) < np.linalg.norm(errors[False])


def test_dynamic_needs_no_calibration(float_outputs) -> None:
    ir = forgekit.from_onnx(make_cnn())
    ir.quantize()  # "any" without calibration is dynamic
    assert ir.quantization["quant_type"] == "dynamic" and ir.quantization["calib_method"] is None
    assert cosine(ir.get_inference_function("host")(samples(1, seed=7)[0]), float_outputs[0]) >= 0.99


def test_user_errors_are_one_line() -> None:
    ir = forgekit.from_onnx(make_cnn())
    with pytest.raises(UsageError, match="needs calibration data"):
        ir.quantize(quant_type="static")
    with pytest.raises(InputError, match="shape 1x3x8x8; the model expects 1x3x16x16"):
        ir.calibrate([np.zeros((1, 3, 8, 8), np.float32)])
    with pytest.raises(InputError, match="dtype float64; the model expects float32"):
        ir.calibrate([np.zeros((1, 3, 16, 16))])
    with pytest.raises(UsageError, match="Unsupported activation dtype 'int4'"):
        ir.quantize(activation_dtype="int4")
    with pytest.raises(UsageError, match="Unsupported kernel dtype"):
        ir.quantize(kernel_dtype="int4")
    assert not ir.is_quantized and not ir.is_calibrated


def test_use_cuda_calibrates_on_the_gpu_or_falls_back_to_the_cpu() -> None:
    """``use_cuda=True`` (the default) runs calibration on the first CUDA GPU when there is one, else quietly on
    the CPU; either way the statistics are those of the CPU run."""
    import tvm

    gpu = forgekit.from_onnx(make_cnn())
    gpu.calibrate(samples(), use_cuda=True)
    cpu = forgekit.from_onnx(make_cnn())
    cpu.calibrate(samples(), use_cuda=False)
    assert cpu.calibration.device == "cpu"
    assert gpu.calibration.device == ("cuda" if tvm.cuda(0).exist else "cpu")
    for g, c in zip(gpu.calibration.stats, cpu.calibration.stats):
        np.testing.assert_allclose([g.min, g.max], [c.min, c.max], rtol=1e-4, atol=1e-5)


def test_calibration_module_builds_for_a_cuda_gpu() -> None:
    """What ``use_cuda`` builds on a GPU machine, built here without one: the instrumented model for the GPU's
    compute capability (nvcc needs the architecture: a bare ``cuda`` target fails and would leave the GPU idle)."""
    import importlib
    import shutil

    from forgekit.backends.cuda.nvcc import _wheel_nvcc
    from forgekit.build import build_executable

    if not (shutil.which("nvcc") or _wheel_nvcc()):
        pytest.skip("needs nvcc (pip install 'forgekit[cuda]'; ./dev.sh installs it)")
    cal = importlib.import_module("forgekit.quantize.calibrate")
    spec = cal.cuda_target("8.6")
    assert spec.tvm_target().attrs["arch"] == "sm_86"
    mod, slots = cal.instrument(forgekit.from_onnx(make_cnn()).mod)
    assert slots == [0, 1, 2, 3]  # the four quantizable ops read four different tensors
    ex = build_executable(mod, spec, opt_level=2)
    kinds = [ex.mod.imports[0].kind] + [m.kind for m in ex.mod.imports[0].imports]
    assert kinds == ["llvm", "cuda"]


def test_calibration_input_forms(tmp_path) -> None:
    ir = forgekit.from_onnx(make_cnn())
    xs = samples(4)
    ir.calibrate(np.concatenate(xs))  # stacked [S, C, H, W] for a batch-1 model
    assert ir.calibration.samples == 4
    ir.calibrate([{"x": xs[0]}, (xs[1],), xs[2][0]], reset=False)  # dict, tuple, missing batch axis
    assert ir.calibration.samples == 7
    np.savez(tmp_path / "c.npz", x=np.stack(xs))
    (tmp_path / "dir").mkdir()
    np.save(tmp_path / "dir" / "a.npy", xs[0])
    np.save(tmp_path / "dir" / "b.npy", np.stack(xs[1:]))
    ir.calibrate(str(tmp_path / "c.npz"))
    assert ir.calibration.samples == 4
    ir.calibrate(tmp_path / "dir")
    assert ir.calibration.samples == 4


# ----------------------------------------------------------------------------- accuracy budget, split
def test_max_accuracy_drop_keeps_layers_in_fp32() -> None:
    ir = forgekit.from_onnx(make_cnn(head=False))  # 4-D output: the metric is cosine, never exactly 1
    ir.calibrate(samples(3))
    ir.quantize(per_channel=True, max_accuracy_drop=0.0)
    rep = ir.quantization_report
    assert rep["metric"] == "cosine" and rep["budget_met"]
    assert sorted(rep["fp32_layers"]) == sorted(op.name for op in graph.describe(ir.float_mod["main"]))
    assert ir.quantization["quantized_ops"] == 0

    ir2 = forgekit.from_onnx(make_cnn(head=False))
    ir2.calibrate(samples(3))
    ir2.quantize(per_channel=True, max_accuracy_drop=0.05)
    rep2 = ir2.quantization_report
    depthwise = graph.describe(ir2.float_mod["main"])[2].name  # fp32 by policy, not by the budget
    assert rep2["budget_met"] and rep2["fp32_layers"] == [depthwise] and len(rep2["layers"]) == 3
    assert [layer["precision"] for layer in rep2["layers"]] == ["int8", "int8", "float32"]
    assert all(layer["cosine"] > 0.98 and layer["snr_db"] > 10 for layer in rep2["layers"])
    with pytest.raises(UsageError, match="between 0 and 1"):
        forgekit.from_onnx(make_cnn()).quantize(max_accuracy_drop=5)


def test_split_tensors(float_outputs) -> None:
    ir = forgekit.from_onnx(make_cnn())
    ir.split_tensors(min_elements=100)  # every regular conv weight here is >= 432 elements
    assert ir.operators["concat"] == 2 and ir.operators["nn.conv2d"] == 5
    np.testing.assert_allclose(ir.get_inference_function("host")(samples(1, seed=7)[0]), float_outputs[0],
                               rtol=1e-4, atol=1e-5)
    ir2 = forgekit.from_onnx(make_cnn())
    ir2.split_tensors()  # nothing this small is split, but the flag is set
    assert ir2.is_split_tensors and "concat" not in ir2.operators
    ir2.calibrate(samples(1))
    with pytest.raises(UsageError, match="force=True"):
        ir2.split_tensors()
    ir2.split_tensors(force=True)
    assert not ir2.is_calibrated


# ----------------------------------------------------------------------------- integer kernels
def _int_module(kind: str, x_dtype: str, seed: int = 0):
    """A Relax module with one integer conv2d (NCHW) or matmul and random int8 weights."""
    import tvm
    from tvm import relax

    rng = np.random.default_rng(seed)
    lo, hi = (-128, 128) if x_dtype == "int8" else (0, 256)
    bb = relax.BlockBuilder()
    if kind == "conv":
        x = rng.integers(lo, hi, (1, 5, 9, 11)).astype(x_dtype)
        w = rng.integers(-127, 128, (20, 5, 3, 3)).astype(np.int8)
        xv = relax.Var("x", relax.TensorType(x.shape, x_dtype))
        with bb.function("main", [xv]):
            with bb.dataflow():
                y = bb.emit_output(relax.op.nn.conv2d(xv, relax.const(w), strides=2, padding=1, out_dtype="int32"))
            bb.emit_func_output(y)
        xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (1, 1), (1, 1)))
        ref = np.zeros((1, 20, 5, 6), np.int64)
        for i in range(5):
            for j in range(6):
                ref[0, :, i, j] = np.tensordot(w.astype(np.int64), xp[0, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3], 3)
    else:
        x = rng.integers(lo, hi, (2, 7, 30)).astype(x_dtype)
        w = rng.integers(-127, 128, (30, 40)).astype(np.int8)
        xv = relax.Var("x", relax.TensorType(x.shape, x_dtype))
        with bb.function("main", [xv]):
            with bb.dataflow():
                y = bb.emit_output(relax.op.matmul(xv, relax.const(w), out_dtype="int32"))
            bb.emit_func_output(y)
        ref = x.astype(np.int64) @ w.astype(np.int64)
    return bb.get(), x, ref.astype(np.int32)


VNNI_TARGET = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "znver4", "num-cores": 2}


@pytest.mark.parametrize("kind", ["conv", "matmul"])
@pytest.mark.parametrize("x_dtype", ["int8", "uint8"])
def test_int8_kernels_use_vpdpbusd_and_are_exact(kind, x_dtype) -> None:
    import tvm
    from tvm import relax

    from forgekit.backends import cpu as schedules
    from forgekit.backends.cpu.int8 import has_vnni
    from forgekit.targets import parse_target

    mod, x, ref = _int_module(kind, x_dtype)
    target = tvm.target.Target(VNNI_TARGET)
    schedules.STATS.clear()
    ex = tvm.compile(mod, target=target, relax_pipeline=schedules.cpu_pipeline(target))
    assert "gemm_int8_vnni" in schedules.STATS.values()
    asm = ex.mod.imports[0].inspect_source("asm")
    assert "vpdpbusd" in asm
    host = parse_target("host").tvm_target()
    if not has_vnni(host):
        pytest.skip("this CPU has no AVX512-VNNI: the kernel was checked in assembly only")
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("mcpu", ["haswell", "x86-64-v3", "skylake-avx512"])
@pytest.mark.parametrize("kind", ["conv", "matmul"])
@pytest.mark.parametrize("x_dtype", ["int8", "uint8"])
def test_int8_kernels_use_vpmaddwd_without_vnni_and_are_exact(mcpu, kind, x_dtype) -> None:
    """x86 CPUs with AVX2 but no VNNI (Zen 2/3, Haswell to Skylake, a portable artifact's v3/v4 levels) ran int8
    on the generic integer code: a 6-conv int8 net at 3.9x its fp32 on a Zen 3.  They now take the vpmaddwd
    micro-kernel on int16-widened operands, whose int32 sums are exact (int8.AVX2)."""
    import tvm
    from tvm import relax

    from forgekit.backends import cpu as schedules
    from forgekit.runtime.cpu import host_features

    mod, x, ref = _int_module(kind, x_dtype)
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    schedules.STATS.clear()
    ex = tvm.compile(mod, target=target, relax_pipeline=schedules.cpu_pipeline(target))
    assert "gemm_int8_avx2" in schedules.STATS.values()
    assert "vpmaddwd" in ex.mod.imports[0].inspect_source("asm")
    if not {"avx2", "fma"} <= host_features() or (mcpu == "skylake-avx512" and "avx512bw" not in host_features()):
        pytest.skip("this CPU cannot run the kernel: checked in assembly only")
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_array_equal(out, ref)


def _conv3x3_ref(x: np.ndarray, w: np.ndarray, dilation: int = 1) -> np.ndarray:
    """int64 reference of a 3x3 stride-1 conv (NCHW data, OIHW weights) padded to the input's size: ``dilation``
    rows above and below (the height dilated), one column each side."""
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (dilation, dilation), (1, 1)))
    return np.stack([np.stack([np.einsum("ocij,bcij->bo", w.astype(np.int64),
                                         xp[:, :, i:i + 2 * dilation + 1:dilation, j:j + 3])
                               for j in range(x.shape[3])], -1) for i in range(x.shape[2])], -2)


@pytest.mark.parametrize(("mcpu", "side", "channels", "dilation", "route"), [
    ("haswell", 16, 32, 1, "fp32-f4"), ("x86-64-v3", 16, 32, 1, "fp32-f4"), ("x86-64-v2", 16, 32, 1, "fp32-f4"),
    ("raspberry-pi/4", 16, 32, 1, "fp32-f4"), ("haswell", 12, 32, 1, "int16-f2"), ("haswell", 16, 96, 1, "int16-f2"),
    ("haswell", 12, 32, 2, "int16-f2"), ("x86-64-v4", 12, 32, 1, "int16-f2"), ("znver4", 16, 32, 1, "direct")])
@pytest.mark.parametrize("x_dtype", ["int8", "uint8"])
def test_int8_3x3_convs_take_winograd_without_a_4_byte_dot_product(mcpu, side, channels, dilation, route,
                                                                   x_dtype) -> None:
    """The class: 3x3 stride-1 integer convs on CPUs without a 4-byte integer dot product (AVX2's vpmaddwd, or
    none).  Direct, they ran 1.2-2x slower than fp32 Winograd: int8 ResNet-18 at 0.78x its fp32's speed on a
    Zen 3 (issue 39: int8 must never lose).  Now (int8_winograd): fp32 F(4x4) on the integer values where fp32
    takes F(4x4) and its U fits a core's L2, or where there is no int16 kernel (SSE-only x86, Cortex-A72: generic
    integer code, 4x fp32 Winograd's time); integer F(2x2) on vpmaddwd otherwise (smaller images, more channels,
    a dilated height), exact to the unit; VNNI keeps its exact direct kernel."""
    import tvm
    from tvm import relax

    from forgekit.backends import cpu as schedules
    from forgekit.runtime.cpu import host_features
    from forgekit.targets import parse_target

    rng = np.random.default_rng(1)
    lo, hi = (-128, 128) if x_dtype == "int8" else (0, 256)
    x = rng.integers(lo, hi, (1, channels, side, side)).astype(x_dtype)
    w = rng.integers(-127, 128, (channels, channels, 3, 3)).astype(np.int8)
    w[:, :, 1, 1] = -128  # the extreme weight: |4U| reaches 9 * 128 - 1 in the middle taps
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, x_dtype))
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.conv2d(xv, relax.const(w), padding=(dilation, 1),
                                                  dilation=(dilation, 1), out_dtype="int32"))
        bb.emit_func_output(y)
    ref = _conv3x3_ref(x, w, dilation)
    target = parse_target(mcpu).tvm_target() if "/" in mcpu else tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    schedules.STATS.clear()
    ex = tvm.compile(bb.get(), target=target, relax_pipeline=schedules.cpu_pipeline(target))
    rules = set(schedules.STATS.values())
    assert ("winograd" in rules) == (route != "direct"), rules
    assert ("gemm_int8_avx2" in rules) == (route == "int16-f2"), rules  # the integer GEMM / no direct kernel
    needs = {"znver4": {"avx512f", "avx512vnni", "avx512bw"}, "x86-64-v4": {"avx512f", "avx512bw"}}.get(
        mcpu, {"avx2", "fma"})
    if "/" in mcpu or not needs <= host_features():
        pytest.skip("this CPU cannot run the kernel: checked the schedule only")
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy().astype(np.int64)
    # F(4x4, 3x3)'s fractions round in fp32: 4e-6 of the sums' magnitude at most (1e-5 checked), against a
    # quantization step of ~1/127 of it; the integer F(2x2) and the direct kernels are exact to the unit
    tol = 1e-5 * np.abs(ref).max() if route == "fp32-f4" else 0
    assert np.abs(out - ref).max() <= tol


def _haswell_int8_conv(w: np.ndarray, shape: list) -> tuple:
    """A uint8 3x3 padding-1 conv with int8 weights ``w`` over ``shape`` (names: symbolic dims), built for Haswell
    (AVX2, no VNNI): the schedule rules it took and its VM (None where this CPU cannot run it)."""
    import tvm
    from tvm import relax, tirx

    from forgekit.backends import cpu as schedules
    from forgekit.runtime.cpu import host_features

    dims = [tirx.Var(d, "int64") if isinstance(d, str) else d for d in shape]
    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(dims, "uint8"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.conv2d(xv, relax.const(w), padding=1, out_dtype="int32"))
        bb.emit_func_output(y)
    target = tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})
    schedules.STATS.clear()
    ex = tvm.compile(bb.get(), target=target, relax_pipeline=schedules.cpu_pipeline(target))
    runs = {"avx2", "fma"} <= host_features()
    return set(schedules.STATS.values()), relax.VirtualMachine(ex, tvm.cpu()) if runs else None


def test_int8_3x3_convs_on_a_dynamic_batch_take_integer_winograd() -> None:
    """The dynamic-batch side of the class above (issue 39: int8 on a dynamic batch must not lose to fp32): a
    symbolic batch over a static image takes the integer F(2x2) too, exact at every batch size."""
    rng = np.random.default_rng(2)
    w = rng.integers(-128, 128, (64, 64, 3, 3)).astype(np.int8)
    rules, vm = _haswell_int8_conv(w, ["n", 64, 12, 12])
    assert {"winograd", "gemm_int8_avx2"} <= rules, rules  # was: direct only
    if vm is None:
        pytest.skip("this CPU cannot run the kernel: checked the schedule only")
    for batch in (1, 3):
        x = rng.integers(0, 256, (batch, 64, 12, 12)).astype(np.uint8)
        np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), _conv3x3_ref(x, w))


def test_int8_3x3_convs_on_a_dynamic_batch_and_image_take_winograd() -> None:
    """Batch, height and width all symbolic (a detector as exported): the images stacked into one tall image
    (winograd.emit), the fp32 F(4x4) route on the integer values; within F(4x4)'s rounding of the exact sums at
    two batches and sizes.  Before, such a conv kept the direct integer kernel."""
    rng = np.random.default_rng(3)
    w = rng.integers(-128, 128, (64, 64, 3, 3)).astype(np.int8)
    rules, vm = _haswell_int8_conv(w, ["n", 64, "h", "w"])
    assert "winograd" in rules, rules
    if vm is None:
        pytest.skip("this CPU cannot run the kernel: checked the schedule only")
    for shape in ((2, 64, 10, 13), (1, 64, 5, 5)):
        x = rng.integers(0, 256, shape).astype(np.uint8)
        ref = _conv3x3_ref(x, w)
        out = vm["main"](tvm.runtime.tensor(x)).numpy().astype(np.int64)
        assert out.shape == ref.shape and np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.parametrize(("tag", "rule"), [("raspberry-pi/5", "gemm_int8_sdot"), ("raspberry-pi/4", None)])
@pytest.mark.parametrize("x_dtype", ["int8", "uint8"])
def test_int8_kernels_use_sdot_on_armv82(tag, rule, x_dtype) -> None:
    """ARMv8.2 dot product (Cortex-A76) takes the sdot micro-kernel; Cortex-A72 has none and keeps the generic
    integer code.  Assembly only here: tests/test_verify.py runs both under qemu against onnxruntime."""
    import tvm

    from forgekit.backends import cpu as schedules
    from forgekit.targets import parse_target

    for kind in ("conv", "matmul"):
        mod, _, _ = _int_module(kind, x_dtype)
        target = parse_target(tag).tvm_target()
        schedules.STATS.clear()
        ex = tvm.compile(mod, target=target, relax_pipeline=schedules.cpu_pipeline(target))
        asm = ex.mod.imports[0].inspect_source("asm")
        if rule:
            assert rule in schedules.STATS.values()
            assert "\tsdot\t" in asm and "vpdpbusd" not in asm
        else:
            assert not any(r.startswith("gemm_int8") for r in schedules.STATS.values())
            assert "\tsdot\t" not in asm


# ----------------------------------------------------------------------------- CLI
def test_cli_compile_quantized(tmp_path) -> None:
    model = tmp_path / "cnn.onnx"
    onnx.save(make_cnn(), model)
    np.save(tmp_path / "calib.npy", np.stack(samples(4)))
    out = tmp_path / "art"
    proc = run_cli("compile", str(model), "-o", str(out), "--quantize", "int8", "--calib-data",
                   str(tmp_path / "calib.npy"), "--per-channel", "--calib-method", "percentile", "--quant-type", "static")
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((out / "metadata.json").read_text())["model"]
    assert meta["precision"] == "int8"
    q = meta["quantization"]
    assert q["calib_method"] == "percentile" and q["per_channel"] and q["quant_type"] == "static"
    assert q["percentile"] == 99.0 and q["calibration_samples"] == 4 and len(q["layers"]) == 3
    assert q["bias_correction"] is True
    assert run_cli("run", str(out), "--random").returncode == 0

    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((2, 1, 3, 8, 8), np.float32))
    for args, code, message in (
        (["--quantize", "int8", "--quant-type", "static"], 2, "needs calibration data"),
        (["--quantize", "int8", "--calib-data", str(bad)], 9, "expects 1x3x16x16"),
        (["--quantize", "fp8"], 2, "Unsupported activation dtype 'fp8'"),
    ):
        proc = run_cli("compile", str(model), "-o", str(tmp_path / "x"), *args)
        assert proc.returncode == code and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "x").exists()

    rep = run_cli("quantize-report", str(model), "--calib-data", str(tmp_path / "calib.npy"), "--per-channel",
                  "--json", str(tmp_path / "rep.json"))
    assert rep.returncode == 0, rep.stderr
    data = json.loads((tmp_path / "rep.json").read_text())
    assert data["metric"] == "top1_agreement" and len(data["layers"]) == 4 and "cos" in rep.stdout
    assert [layer["precision"] for layer in data["layers"]].count("float32") == 1  # the depthwise conv
    rep = run_cli("quantize-report", str(model), "--calib-data", str(tmp_path / "calib.npy"), "--quantize-depthwise",
                  "--no-bias-correction", "--json", str(tmp_path / "rep_dw.json"))
    assert rep.returncode == 0, rep.stderr
    assert {layer["precision"] for layer in json.loads((tmp_path / "rep_dw.json").read_text())["layers"]} == {"int8"}


# ----------------------------------------------------------------------------- pre-quantized ONNX
def _ort(path, x):
    return ort_run(path, {"x": x})[0]  # without onnxruntime's saturating u8s8 path of CPUs with no VNNI


@pytest.mark.parametrize("activation", ["QInt8", "QUInt8"])
def test_ort_quantize_static_qdq_runs_on_integer_kernels(tmp_path, activation) -> None:
    from forgekit.backends import cpu as schedules

    dst = ort_qdq_cnn(tmp_path, activation)
    ir = forgekit.from_onnx(dst)
    schedules.STATS.clear()
    f = ir.get_inference_function("host")
    # the two regular convs and the matmul run on the host's dot-product kernels (VNNI, or vpmaddwd on AVX2),
    # the depthwise one on the generic rule
    kernel = host_dot_kernel()
    assert list(schedules.STATS.values()).count(kernel.rule if kernel else "none") == 3
    for x in samples(2, seed=9):
        expected = _ort(dst, x)
        np.testing.assert_allclose(f(x), expected, rtol=0, atol=1e-5 * np.abs(expected).max())


def test_ort_dynamic_conv_integer_and_matmul_integer(tmp_path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src, dst = tmp_path / "cnn.onnx", tmp_path / "cnn_dyn.onnx"
    onnx.save(make_cnn(), src)
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Conv"])
    ops = {n.op_type for n in onnx.load(dst).graph.node}
    assert {"ConvInteger", "MatMulInteger", "DynamicQuantizeLinear"} <= ops
    f = forgekit.from_onnx(dst).get_inference_function("host")
    for x in samples(2, seed=9):
        expected = _ort(dst, x)
        np.testing.assert_allclose(f(x), expected, rtol=0, atol=1e-5 * np.abs(expected).max())


def test_smoothing_tames_outlier_channels_of_matmuls() -> None:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((64, 32)) * 0.1).astype(np.float32)
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    g = helper.make_graph([node], "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 32])],
                          [numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8

    def data(n: int, seed: int) -> list[np.ndarray]:
        r = np.random.default_rng(seed)
        xs = [r.standard_normal((1, 16, 64)).astype(np.float32) for _ in range(n)]
        for x in xs:
            x[..., :2] *= 60.0  # two outlier channels, as after a transformer's LayerNorm
        return xs

    ir = forgekit.from_onnx(model)
    ir.calibrate(data(4, 1))
    x = data(1, 2)[0]
    ref = ir.get_inference_function("host")(x)
    plain, smooth = ir.copy(), ir.copy()
    plain.quantize(per_channel=True, calib_method="minmax", smoothing=None)
    smooth.quantize(per_channel=True, calib_method="minmax")
    c_plain = cosine(plain.get_inference_function("host")(x), ref)
    c_smooth = cosine(smooth.get_inference_function("host")(x), ref)
    assert smooth.quantization["smoothing"] == 0.75 and plain.quantization["smoothing"] is None
    assert c_smooth >= 0.999 and c_smooth > c_plain
