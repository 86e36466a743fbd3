"""bf16 conv2d/matmul (forgekit/backends/cpu/bf16.py): vdpbf16ps in the code, accuracy against fp32
onnxruntime, metadata, and the one-line refusals.  Runs need a CPU with AVX512_BF16; compiles do not."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import forgekit as forge
from conftest import GUARDED_BUFFER, ort_run, run_cli
from forgekit.errors import TargetError, UsageError
from forgekit.runtime import Engine
from forgekit.runtime.cpu import host_arch, host_features
from onnx_models import make_cnn, samples

needs_bf16 = pytest.mark.skipif("avx512bf16" not in host_features(),
                                reason="this CPU has no AVX512_BF16: bf16 artifacts compile but cannot run here")
x86_only = pytest.mark.skipif(host_arch() != "x86_64", reason="compiles for an x86-64 target with this machine's linker")
ZNVER4 = "llvm -mcpu=znver4"  # a target with AVX512_BF16, compiled for on any x86-64 machine


@pytest.fixture(scope="module")
def cnn_path(tmp_path_factory):
    """make_cnn with a 100-class head: 3x3 convs (3 and 16 input channels), a depthwise conv that stays fp32,
    a MatMul whose 100 columns are padded to 112."""
    path = tmp_path_factory.mktemp("bf16") / "cnn.onnx"
    onnx.save(make_cnn(seed=3, classes=100), path)
    return path


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@x86_only
def test_kernels_use_vdpbf16ps() -> None:
    """Compile only: a matmul (N=40: padded to 48 and sliced) and a conv with padding and an odd channel count."""
    import tvm
    from tvm import relax

    from forgekit.backends import cpu

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 12, 12), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(rng.standard_normal((32, 3, 3, 3)).astype("float32")),
                                           padding=[1, 1]))
            y = bb.emit(relax.op.reshape(relax.op.nn.relu(y), (32, 144)))
            y = bb.emit_output(relax.op.matmul(y, relax.const(rng.standard_normal((144, 40)).astype("float32"))))
        bb.emit_func_output(y)
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})
    cpu.STATS.clear()
    ex = tvm.compile(bb.get(), target=target, relax_pipeline=cpu.cpu_pipeline(target, bf16=True))
    rules = dict(cpu.STATS)
    assert sorted(k for k, v in rules.items() if v == "gemm_bf16") == ["fused_conv2d_bf16_relu", "matmul_bf16"], rules
    asm = ex.mod.imports[0].inspect_source("asm")
    assert asm.count("vdpbf16ps") >= 2
    assert "forgekit_dpbf16ps" not in asm.replace("pragma", "")  # linked in and inlined: no call left


@needs_bf16
def test_bf16_artifact_matches_fp32_onnxruntime(cnn_path, tmp_path) -> None:
    model = onnx.load(cnn_path)
    result = forge.from_onnx(cnn_path).compile(target="host", output_path=tmp_path / "bf16", set_bfloat16=True,
                                               export_metadata=True)
    assert result.metadata["model"]["precision"] == "bfloat16"
    rules = json.loads((result.path / "compile_report.json").read_text())["schedule_rules"]
    assert sum(v == "gemm_bf16" for v in rules.values()) == 3, rules  # 2 convs + the matmul; depthwise stays fp32
    engine = Engine(result.path)
    for x in samples(6, seed=7):
        expected = ort_run(model, {"x": x})[0]
        actual = engine.infer(x)[0]
        assert _cosine(actual, expected) >= 0.999
        assert int(np.argmax(actual)) == int(np.argmax(expected))
        # bf16 does round: a result equal to fp32 would mean the bf16 kernels did not run
        assert not np.allclose(actual, expected, rtol=1e-6, atol=1e-6)


def _convnet(channels: int, batch: int | str = "N", ic: int = 3, k: int = 3) -> onnx.ModelProto:
    """Conv(ic->channels, kxk)+bias -> Relu -> GlobalAveragePool -> Flatten -> Gemm(channels->10)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((channels, ic, k, k)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array((rng.standard_normal(channels) * 0.1).astype(np.float32), "b"),
             numpy_helper.from_array(rng.standard_normal((10, channels)).astype(np.float32), "fw"),
             numpy_helper.from_array(rng.standard_normal(10).astype(np.float32), "fb")]
    nodes = [helper.make_node("Conv", ["input", "w", "b"], ["c"], pads=[k // 2] * 4),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("GlobalAveragePool", ["r"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]), helper.make_node("Gemm", ["f", "fw", "fb"], ["out"], transB=1)]
    graph = helper.make_graph(nodes, "convnet", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                               [batch, ic, 16, 16])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [batch, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@x86_only
def test_symbolic_batch(tmp_path) -> None:
    """A symbolic batch: the conv runs in bf16 (serially: the kernel is small, see gemm_bf16._parallel_ok), the
    matmul over the symbolic rows stays fp32."""
    onnx.save(_convnet(16), tmp_path / "convnet.onnx")
    result = forge.from_onnx(tmp_path / "convnet.onnx").compile(target=ZNVER4, output_path=tmp_path / "dyn",
                                                                set_bfloat16=True, export_metadata=True)
    rules = json.loads((result.path / "compile_report.json").read_text())["schedule_rules"]
    assert [k for k, v in rules.items() if v == "gemm_bf16"] == ["fused_conv2d_bf16_add_relu"], rules
    if "avx512bf16" in host_features():
        engine = Engine(result.path)
        for batch in (1, 3):
            x = np.random.default_rng(batch).standard_normal((batch, 3, 16, 16)).astype(np.float32)
            expected = ort_run(tmp_path / "convnet.onnx", {"input": x})[0]
            assert _cosine(engine.infer(x)[0], expected) >= 0.999


@x86_only
@pytest.mark.parametrize("channels, ic, k, bf16", [(8, 3, 3, False), (16, 12, 1, False), (16, 3, 3, True),
                                                   (16, 24, 1, True)])
def test_small_convs_stay_fp32(tmp_path, channels, ic, k, bf16) -> None:
    """Convs with at most 8 output channels (16 lanes computed for 8) or under 20 products per output (1x1
    over 12 channels) keep the fp32 kernel, which was faster there (bf16.MIN_CHANNELS, MIN_PRODUCTS)."""
    onnx.save(_convnet(channels, 1, ic, k), tmp_path / "m.onnx")
    result = forge.from_onnx(tmp_path / "m.onnx").compile(target=ZNVER4, output_path=tmp_path / "a",
                                                          set_bfloat16=True, export_metadata=True)
    rules = json.loads((result.path / "compile_report.json").read_text())["schedule_rules"]
    assert [k for k, v in rules.items() if "conv" in k and v == "gemm_bf16"] == (["fused_conv2d_bf16_add_relu"]
                                                                             if bf16 else []), rules


@x86_only
def test_refused_without_avx512_bf16(cnn_path, tmp_path) -> None:
    ir = forge.from_onnx(cnn_path)
    for target in ("llvm -mcpu=haswell", "x86/znver3", "x86-64"):
        with pytest.raises(TargetError, match="AVX512_BF16") as info:
            ir.compile(target=target, output_path=tmp_path / "no", set_bfloat16=True)
        assert "\n" not in str(info.value) and info.value.exit_code == 5
    with pytest.raises(UsageError, match="opt level 3 or 4"):
        ir.compile(target=ZNVER4, output_path=tmp_path / "no", set_bfloat16=True, opt_level=2)
    with pytest.raises(UsageError, match="exclude each other"):
        ir.compile(target=ZNVER4, output_path=tmp_path / "no", set_bfloat16=True, set_float16=True)
    assert not (tmp_path / "no").exists()


@x86_only
def test_cli_precision(cnn_path, tmp_path) -> None:
    proc = run_cli("compile", str(cnn_path), "--precision", "bf16", "-t", "llvm -mcpu=haswell", "-o", str(tmp_path / "a"))
    assert proc.returncode == 5, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "AVX512_BF16" in lines[0] and "Traceback" not in proc.stderr
    bad = run_cli("compile", str(cnn_path), "--precision", "int4", "-o", str(tmp_path / "b"))
    assert bad.returncode == 2 and "use fp32, bf16 or fp16" in bad.stderr
    # compiles for a bf16 target on any x86-64 machine; the metadata says bf16
    ok = run_cli("compile", str(cnn_path), "--precision", "bf16", "-t", ZNVER4, "-o", str(tmp_path / "c"))
    assert ok.returncode == 0, ok.stderr
    meta = json.loads((tmp_path / "c" / "metadata.json").read_text())
    assert meta["model"]["precision"] == "bfloat16"


@needs_bf16
def test_verify_and_bench_judge_a_bf16_artifact_by_cosine(cnn_path, tmp_path) -> None:
    """verify and bench compare a bf16 artifact with the fp32 model by cosine (>= 0.999): fp32's elementwise
    tolerances called a correct bf16 artifact's outputs different and bench exited 13."""
    from forgekit.evaluate.bench import benchmark_artifact
    from forgekit.evaluate.verify import verify_artifact

    out = tmp_path / "bf16"
    forge.from_onnx(cnn_path).compile(target="host", output_path=out, set_bfloat16=True)
    result = verify_artifact(out, cnn_path)
    assert result.min_cosine == 0.999 and all(o.cosine is not None and o.cosine >= 0.999 for o in result.outputs)
    result.check()
    assert "cosine 0.99" in result.outputs[0].line()
    bench = benchmark_artifact(out, cnn_path, runs=2, warmup=0, memory=False)
    assert bench.outputs_match is True and bench.extra["min_cosine"] >= 0.999
    assert run_cli("bench", str(out), "--onnx", str(cnn_path), "-n", "2", "--no-memory").returncode == 0



@needs_bf16
@pytest.mark.slow
def test_an_ill_conditioned_output_is_judged_against_the_references_own_cosine(tmp_path) -> None:
    """PP-OCRv4 det on random pixels: a probability map of about 1e-9 whose fp32 evaluations disagree with each
    other (onnxruntime optimized vs unoptimized: cosine 0.95 at 160x160, 0.9975 at 640x640).  A bar of 0.999
    called the bf16 artifact (0.96) wrong, and bench exited 13; it is judged within 4x the reference's own
    deficit now, and the line says why."""
    import importlib.util
    from pathlib import Path

    from forgekit.evaluate.verify import verify_artifact

    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("rapidocr-onnxruntime is not installed (./dev.sh test installs it)")
    det = Path(list(spec.submodule_search_locations)[0]) / "models" / "ch_PP-OCRv4_det_infer.onnx"
    out = tmp_path / "det"
    forge.from_onnx(det, shape_dict={"x": [1, 3, 160, 160]}).compile(target="host", output_path=out,
                                                                     set_bfloat16=True)
    result = verify_artifact(out, det)
    (output,) = result.outputs
    assert output.cosine < 0.999 and 0 < output.cosine_noise, output.line()  # the case, not a well-conditioned one
    assert output.ok and "ill-conditioned" in output.line()
    result.check()
    # bench: the same allowance, and OpenVINO f32 (off by 1e-7 on this map) judged by the fp32 noise floor
    # although forgekit's artifact needed none (it was called different next to a bf16 artifact)
    from forgekit.evaluate.bench import benchmark_artifact

    bench = benchmark_artifact(out, det, runs=2, warmup=0, memory=False, peers=["openvino"])
    assert bench.outputs_match is True and bench.extra["reference_cosine"] < 0.999
    assert bench.peer_info["openvino-f32"]["outputs_match"] is True


_GUARDED = GUARDED_BUFFER + r'''
import sys
import tvm
from tvm import relax
from forgekit.backends import cpu

shape = (1, 16, 16, 16)  # NHWC fp32: 16 KiB, whole pages
x_np = guarded(shape, np.float32)
rng = np.random.default_rng(0)
x_np[...] = rng.standard_normal(shape)
w = rng.standard_normal((3, 3, 16, 32)).astype("float32")
bb = relax.BlockBuilder()
x = relax.Var("x", relax.TensorType(shape, "float32"))
with bb.function("main", [x]):
    with bb.dataflow():  # NHWC on the input itself: the bf16 prologue reads the guarded buffer
        y = bb.emit_output(relax.op.nn.conv2d(x, relax.const(w), padding=[1, 1], data_layout="NHWC",
                                              kernel_layout="HWIO"))
    bb.emit_func_output(y)
target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})
ex = tvm.compile(bb.get(), target=target, relax_pipeline=cpu.cpu_pipeline(target, bf16=True))
xt = tvm.runtime.from_dlpack(x_np)
x_np[0, 0, 0, 0] += 1.0
assert xt.numpy()[0, 0, 0, 0] == x_np[0, 0, 0, 0], "from_dlpack copied: the guard pages would not be tested"
out = relax.VirtualMachine(ex, tvm.cpu())["main"](xt).numpy()
ref = np.zeros((1, 16, 16, 32))
xp = np.pad(x_np.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
for i in range(3):
    for j in range(3):
        ref += np.einsum("nhwc,co->nhwo", xp[:, i:i + 16, j:j + 16], w[i, j])
cos = float((out.ravel() @ ref.ravel()) / np.linalg.norm(out) / np.linalg.norm(ref))
print("cosine", cos)
sys.exit(0 if cos >= 0.999 else 3)
'''


@needs_bf16
def test_padded_prologue_reads_only_its_input(tmp_path) -> None:
    """The padding prologue must not load outside its input: with Select, TVM dropped the index clamps under
    the condition and loaded the rows above and below anyway (PP-OCRv4 det segfaulted in 'forgekit bench').
    The input here sits between two PROT_NONE pages, so such a load crashes the child process."""
    import subprocess
    import sys

    script = tmp_path / "guarded.py"
    script.write_text(_GUARDED)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "cosine" in proc.stdout


def _nhwc_conv(h: int, ic: int, oc: int, k: int) -> tuple:
    import tvm  # noqa: F401
    from tvm import relax

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((k, k, ic, oc)) / np.sqrt(ic * k * k)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, h, h, ic), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.relu(relax.op.nn.conv2d(x, relax.const(w), padding=[k // 2] * 2,
                                                                   data_layout="NHWC", kernel_layout="HWIO")))
        bb.emit_func_output(y)
    return bb.get(), w


@x86_only
@pytest.mark.parametrize("ic, oc, k, inner", [(24, 96, 1, True), (64, 256, 1, True), (1024, 512, 1, False)])
def test_tile_loop_order_follows_weight_size(ic, oc, k, inner) -> None:
    """Weights up to 512 KiB: pixel tiles outer, channel blocks inner (rules.gemm_bf16.channels_inner); bigger
    weights (1x1 1024->512: 1 MiB) keep a channel block over all pixels.  Both orders compute the conv.
    (3x3 stride-1 convs with 32+ channels are Winograd GEMMs now: test_winograd.py.)"""
    import tvm
    from tvm import relax

    from forgekit.backends import cpu
    from forgekit.backends.cpu import fusion_passes
    from forgekit.backends.cpu.registry import ApplyRules

    mod, w = _nhwc_conv(8, ic, oc, k)
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})
    with target:
        scheduled = tvm.transform.Sequential([*fusion_passes(target, True, True, True, True), ApplyRules(target)])(mod)
    import re

    names = [m for gv, func in scheduled.functions.items() if "conv2d_bf16" in gv.name_hint
             for m in re.findall(r"for (\w+) in T\.\w+\([^\n]*pragma_import_llvm", func.script())]
    assert len(names) == 1, names  # the tile loop, which links the vdpbf16ps helper
    assert names[0].endswith("ff_0_fused") == inner and names[0].startswith("ff_0") != inner, names
    if "avx512bf16" in host_features():
        ex = tvm.compile(mod, target=target, relax_pipeline=cpu.cpu_pipeline(target, bf16=True))
        x = np.random.default_rng(1).standard_normal((1, 8, 8, ic)).astype("float32")
        out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
        xp = np.pad(x.astype(np.float64), ((0, 0), (k // 2, k // 2), (k // 2, k // 2), (0, 0)))
        ref = sum(np.einsum("nhwc,co->nhwo", xp[:, i:i + 8, j:j + 8], w[i, j]) for i in range(k) for j in range(k))
        assert _cosine(out, np.maximum(ref, 0)) >= 0.999


@x86_only
def test_strided_1x1_rounds_only_the_pixels_it_reads() -> None:
    """A 1x1 stride-2 conv (ResNet's downsample) rounds the 4x4 pixels it reads, not the 8x8 input: its
    prologue buffer is [1, 4, 4, 32]; the result is still the strided conv (2-5 % faster per ResNet-50
    downsample conv, same-process A/B)."""
    import re

    import tvm
    from tvm import relax

    from forgekit.backends import cpu
    from forgekit.backends.cpu import fusion_passes
    from forgekit.backends.cpu.registry import ApplyRules

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((1, 1, 32, 48)) / np.sqrt(32)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 8, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.conv2d(x, relax.const(w), strides=[2, 2], data_layout="NHWC",
                                                  kernel_layout="HWIO"))
        bb.emit_func_output(y)
    mod = bb.get()
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})
    with target:
        scheduled = tvm.transform.Sequential([*fusion_passes(target, True, True, True, True), ApplyRules(target)])(mod)
    scripts = [f.script() for gv, f in scheduled.functions.items() if "conv2d_bf16" in gv.name_hint]
    assert len(scripts) == 1
    lines = [ln for ln in scripts[0].splitlines() if "data_bf16 = T.sblock_alloc_buffer" in ln]
    shapes = [[int(d) for d in re.findall(r"T\.int64\((\d+)\)", ln)] for ln in lines]
    assert shapes == [[1, 4, 4, 32]], lines
    if "avx512bf16" in host_features():
        ex = tvm.compile(mod, target=target, relax_pipeline=cpu.cpu_pipeline(target, bf16=True))
        xv = rng.standard_normal((1, 8, 8, 32)).astype("float32")
        out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(xv)).numpy()
        ref = np.einsum("nhwc,co->nhwo", xv[:, ::2, ::2].astype(np.float64), w[0, 0])
        assert out.shape == (1, 4, 4, 48) and _cosine(out, ref) >= 0.999
