"""3x3 stride-1 convolutions as Winograd F(2x2, 3x3) (forgekit/backends/cpu/winograd.py, rules/winograd.py).

The class covered: every 3x3, stride-1, dilation-1, padding-1, ungrouped fp32 (or bf16) convolution with at
least 32 input channels (16 in fp32 on AVX2) and output channels in whole vectors, at any even or odd static size
and batch, with or without a fused bias/ReLU/residual epilogue.  Others keep the direct kernel.  Dynamic sizes,
dilated heights and other paddings: test_winograd_dynamic.py."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

import forgekit as forge
from conftest import GUARDED_BUFFER, assert_close, ort_run
from forgekit.backends import cpu
from forgekit.backends.cpu import winograd
from forgekit.runtime import Engine
from forgekit.runtime.cpu import host_features

HOST = tvm.target.Target({"kind": "llvm", "mcpu": "znver4" if "avx512f" in host_features() else "x86-64-v2"})


def _reference(x: np.ndarray, w: np.ndarray, stride: int = 1, dilation: int = 1) -> np.ndarray:
    """NHWC/HWIO convolution in float64, padding 1."""
    n, h, wd, _ = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    oh = (h + 2 - dilation * 2 - 1) // stride + 1
    ow = (wd + 2 - dilation * 2 - 1) // stride + 1
    out = np.zeros((n, oh, ow, w.shape[3]))
    for i in range(3):
        for j in range(3):
            patch = xp[:, i * dilation:i * dilation + stride * (oh - 1) + 1:stride,
                       j * dilation:j * dilation + stride * (ow - 1) + 1:stride]
            out += np.einsum("nhwc,co->nhwo", patch, w[i, j])
    return out


def _build(shape: tuple, w: np.ndarray, stride: int = 1, dilation: int = 1, bf16: bool = False,
           mcpu: str | None = None) -> tuple:
    """(kernel names -> rules, a function running the NHWC conv + ReLU) for ``shape`` and HWIO ``w``, built for
    ``mcpu`` (default: the host's best of AVX-512 and SSE)."""
    from forgekit.backends.cpu.registry import STATS

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(w), strides=stride, dilation=dilation, padding=[1, 1],
                                           data_layout="NHWC", kernel_layout="HWIO"))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    STATS.clear()
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4" if bf16 else mcpu}) if bf16 or mcpu else HOST
    ex = tvm.compile(bb.get(), target=target, relax_pipeline=cpu.cpu_pipeline(target, bf16=bf16))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return dict(STATS), lambda a: vm["main"](tvm.runtime.tensor(a)).numpy()


@pytest.mark.parametrize("n,h,w,c,k", [(1, 8, 8, 32, 32), (1, 7, 7, 64, 48), (2, 9, 6, 40, 16), (1, 14, 14, 96, 64),
                                       (1, 16, 16, 32, 32), (2, 18, 21, 48, 32)])
def test_winograd_matches_the_direct_convolution(n, h, w, c, k) -> None:
    """Even and odd sizes (odd ones cover a partly empty last tile row/column), batch 2, C != K; from 14x14
    up, F(4x4, 3x3) (:func:`winograd.choose`)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, h, w, c)).astype(np.float32)
    wt = (rng.standard_normal((3, 3, c, k)) / np.sqrt(9 * c)).astype(np.float32)
    rules, run = _build(x.shape, wt)
    assert "winograd" in rules.values() and any(name.startswith("winograd_gemm") for name in rules), rules
    ref = np.maximum(_reference(x, wt), 0)
    # at unit scale, F(2x2, 3x3) rounds like the direct kernel (within 1e-5 of float64); F(4x4, 3x3), whose
    # transforms scale by up to 8, within 1e-4 (measured 2e-5), still 10x inside onnxruntime comparisons' 1e-3
    f4 = winograd.choose((n, h, w, k), c) is winograd.F4
    assert f4 == (min(h, w) >= winograd.F4_MIN_SIDE)
    tol = 1e-4 if f4 else 1e-5
    np.testing.assert_allclose(run(x), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("stride,dilation,c", [(2, 1, 64), (1, 2, 64), (1, 1, 16)])
def test_other_convolutions_keep_the_direct_kernel(stride, dilation, c) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 12, 12, c)).astype(np.float32)
    wt = (rng.standard_normal((3, 3, c, 32)) / np.sqrt(9 * c)).astype(np.float32)
    rules, run = _build(x.shape, wt, stride, dilation)
    assert "winograd" not in rules.values(), rules
    np.testing.assert_allclose(run(x), np.maximum(_reference(x, wt, stride, dilation), 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("c,k,side", [(16, 16, 20), (16, 64, 15), (24, 24, 9)])
def test_avx2_takes_winograd_from_16_input_channels(c, k, side) -> None:
    """The class: fp32 3x3 stride-1 convs over 16 to 31 input channels on AVX2 (SqueezeNet's expands, YOLOv8n's
    first C2f bottlenecks, UNet-style decoders' last stages).  The direct kernel ran them at about half the CPU's
    peak, Winograd 1.3-2.5x faster (winograd.MIN_CHANNELS_BY_LANES); they kept the direct kernel before.  An
    8-lane target takes Winograd and matches float64; AVX-512 and SSE targets keep the direct kernel (not
    measured there), as the int8 route does everywhere."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, side, side, c)).astype(np.float32)
    wt = (rng.standard_normal((3, 3, c, k)) / np.sqrt(9 * c)).astype(np.float32)
    for mcpu, takes in (("haswell", True), ("skylake-avx512", False), ("x86-64-v2", False)):
        rules, run = _build(x.shape, wt, mcpu=mcpu)
        assert ("winograd" in rules.values()) == takes, (mcpu, rules)
        if mcpu == "haswell" and {"avx2", "fma"} <= host_features():
            f4 = winograd.choose((1, side, side, k), c) is winograd.F4
            tol = 1e-4 if f4 else 1e-5
            np.testing.assert_allclose(run(x), np.maximum(_reference(x, wt), 0), rtol=tol, atol=tol)
    a = relax.op.nn.conv2d(relax.Var("x", relax.TensorType((1, side, side, c), "float32")), relax.const(wt),
                           padding=[1, 1], data_layout="NHWC", kernel_layout="HWIO").attrs
    assert not winograd.applies(a, wt, (1, side, side, c), 8, winograd.MIN_CHANNELS)  # int8's bound


@pytest.mark.parametrize("tile", [winograd.F2, winograd.F4], ids=["F2", "F4"])
def test_transforms_give_the_convolution_of_one_tile(tile) -> None:
    """A^T [(G g G^T) * (B^T d B)] A is the m x m 'valid' convolution of the (m + 2)-square patch d."""
    rng = np.random.default_rng(2)
    g = rng.standard_normal((3, 3, 1, 1)).astype(np.float32)
    d = rng.standard_normal((tile.alpha, tile.alpha))
    bt, at = np.array(tile.bt, float), np.array(tile.at, float)
    u = winograd.transform_weights(g, tile).reshape(tile.alpha, tile.alpha)
    y = at @ (u * (bt @ d @ bt.T)) @ at.T
    ref = np.array([[np.sum(d[i:i + 3, j:j + 3] * g[:, :, 0, 0]) for j in range(tile.m)] for i in range(tile.m)])
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def _silu_pair(c: int = 32, hw: int = 16) -> tuple:
    """conv -> SiLU (x * sigmoid(x): the bias add feeds two consumers) -> conv: YOLOv8's C2f bottleneck."""
    rng = np.random.default_rng(5)
    w = [numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32), f"w{i}")
         for i in range(2)]
    b = numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w0", "b"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c1"], ["s1"]),
             helper.make_node("Mul", ["c1", "s1"], ["a1"]),
             helper.make_node("Conv", ["a1", "w1", "b"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "silu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, hw, hw])], [*w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, rng.standard_normal((1, c, hw, hw)).astype(np.float32)


def test_silu_epilogue_with_two_consumers(tmp_path) -> None:
    """The bias add feeds both Sigmoid and Mul: the epilogue is inlined into its last block, computed per tile
    row.  Reverse-inlining each consumer into the transform failed and the fallback schedule made TIR that
    TVM refused ("T_add_intermediate is used before its definition": the YOLOv8-style detector did not compile)."""
    model, x = _silu_pair()
    result = forge.from_onnx(model).compile(target="host", output_path=tmp_path / "a", export_metadata=True)
    rules = __import__("json").loads((result.path / "compile_report.json").read_text())["schedule_rules"]
    assert [r for name, r in rules.items() if "winograd_output" in name and "sigmoid" in name] == ["winograd"], rules
    assert_close(Engine(result.path).infer(x)[0], ort_run(model, {"x": x})[0])


def _resnet_block(c: int = 64, hw: int = 10) -> tuple:
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "b"),
             numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "x"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, hw, hw])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, rng.standard_normal((1, c, hw, hw)).astype(np.float32)


@pytest.mark.parametrize("opt_level", [3, 4])
def test_residual_block_matches_onnxruntime(opt_level, tmp_path) -> None:
    """Two Winograd convs, the second with bias-free output, a residual add and ReLU fused after its output
    transform, through the ONNX front end and the artifact runtime."""
    import json

    model, x = _resnet_block()
    result = forge.from_onnx(model).compile(target="host", output_path=tmp_path / "a", opt_level=opt_level,
                                            export_metadata=True)
    rules = json.loads((result.path / "compile_report.json").read_text())["schedule_rules"]
    assert sum(rule == "winograd" for rule in rules.values()) >= 3, rules  # two inputs, one output at least
    assert_close(Engine(result.path).infer(x)[0], ort_run(model, {"x": x})[0])


@pytest.mark.skipif("avx512bf16" not in host_features(), reason="bf16 kernels need AVX512_BF16 to run")
def test_bf16_winograd_keeps_the_cosine() -> None:
    """bf16 V and U through vdpbf16ps: per layer cosine 0.99999 vs float64 (the direct bf16 kernel: 0.999999)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 14, 14, 64)).astype(np.float32)
    wt = (rng.standard_normal((3, 3, 64, 64)) / np.sqrt(9 * 64)).astype(np.float32)
    rules, run = _build(x.shape, wt, bf16=True)
    assert any(name.startswith("winograd_gemm") and rule == "gemm_bf16" for name, rule in rules.items()), rules
    out, ref = run(x).ravel(), np.maximum(_reference(x, wt), 0).ravel()
    assert float(out @ ref / np.linalg.norm(out) / np.linalg.norm(ref)) >= 0.99999


_GUARDED = GUARDED_BUFFER + r'''
import sys
import tvm
from tvm import relax
from forgekit.backends import cpu

shape = (1, 16, 16, 32)  # NHWC fp32: 32 KiB, whole pages
x_np = guarded(shape, np.float32)
rng = np.random.default_rng(0)
x_np[...] = rng.standard_normal(shape)
w = (rng.standard_normal((3, 3, 32, 32)) / 17).astype("float32")
bb = relax.BlockBuilder()
x = relax.Var("x", relax.TensorType(shape, "float32"))
with bb.function("main", [x]):
    with bb.dataflow():
        y = bb.emit_output(relax.op.nn.conv2d(x, relax.const(w), padding=[1, 1], data_layout="NHWC",
                                              kernel_layout="HWIO"))
    bb.emit_func_output(y)
target = tvm.target.Target({"kind": "llvm", "mcpu": sys.argv[1]})
ex = tvm.compile(bb.get(), target=target, relax_pipeline=cpu.cpu_pipeline(target))
xt = tvm.runtime.from_dlpack(x_np)
out = relax.VirtualMachine(ex, tvm.cpu())["main"](xt).numpy()
print("max", float(np.abs(out).max()))
'''


def test_input_transform_reads_only_its_input(tmp_path) -> None:
    """The input between two PROT_NONE pages: the padding is its own copy, so no vector load of the
    transform reaches outside the input (the class of crash the bf16 and int8 prologues had)."""
    script = tmp_path / "guarded.py"
    script.write_text(_GUARDED)
    mcpu = "znver4" if "avx512f" in host_features() else "x86-64-v2"
    proc = subprocess.run([sys.executable, str(script), mcpu], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "max" in proc.stdout
