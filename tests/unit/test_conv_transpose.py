"""General ConvTranspose as one phase convolution + depth-to-space (forgekit/passes/conv_transpose.py): kernels
2-4, strides 1-2, padding and output_padding, against onnxruntime in fp32 and bf16 (issue 39, point 7).

Before, only stride == kernel was rewritten; every other ConvTranspose ran as TVM's unscheduled NCHW loop
nest (a ViT decoder: half its time at ~44 GFLOP/s) and bf16 builds left it in fp32."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit as forge
from conftest import assert_close, ort_run
from forgekit.passes.conv_transpose import phase_weights
from forgekit.runtime import Engine
from forgekit.runtime.cpu import host_arch, host_features

needs_bf16 = pytest.mark.skipif("avx512bf16" not in host_features() or host_arch() != "x86_64",
                                reason="this CPU has no AVX512_BF16: bf16 artifacts compile but cannot run here")

CASES = [  # kernel, stride, pads (top, left, bottom, right), output_padding
    (2, 1, (0, 0, 0, 0), 0), (3, 1, (1, 1, 1, 1), 0), (4, 1, (1, 2, 2, 1), 0),
    (2, 2, (0, 0, 0, 0), 0), (3, 2, (1, 1, 1, 1), 1), (3, 2, (0, 0, 0, 0), 0), (4, 2, (1, 1, 1, 1), 0),
    (4, 2, (0, 1, 2, 0), 1), (2, 2, (1, 0, 0, 1), 1),
]


def conv_transpose(kernel: int, stride: int, pads, output_padding: int, cin: int = 16, cout: int = 24,
                   size: tuple[int, int] = (9, 11)) -> onnx.ModelProto:
    rng = np.random.default_rng(kernel * 10 + stride)
    attrs = {"kernel_shape": [kernel, kernel], "strides": [stride, stride], "pads": list(pads)}
    if output_padding:
        attrs["output_padding"] = [output_padding] * 2
    w = (rng.standard_normal((cin, cout, kernel, kernel)) / np.sqrt(cin * kernel)).astype(np.float32)
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b")]
    oh, ow = ((n - 1) * stride + kernel + output_padding - pads[i] - pads[i + 2] for i, n in enumerate(size))
    graph = helper.make_graph(nodes, "ct", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", cin, *size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", cout, oh, ow])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_phase_weights_keep_every_tap_once() -> None:
    """Each of the K*K taps lands in exactly one phase; the rest of the T x T kernels are zeros."""
    for kernel, stride in [(2, 1), (3, 2), (4, 2), (2, 2), (3, 1)]:
        w = np.arange(1, 2 * 3 * kernel * kernel + 1, dtype=np.float32).reshape(2, 3, kernel, kernel)
        p = phase_weights(w, (stride, stride))
        assert p.shape[0] == stride * stride * 3 and np.count_nonzero(p) == w.size
        assert sorted(p[p != 0].tolist()) == sorted(w.ravel().tolist())


def _graph(model: onnx.ModelProto) -> str:
    """The module after the CPU pipeline's Relax prefix (phase 2)."""
    from forgekit.backends.cpu.pipeline import preprocess

    return preprocess()(forge.from_onnx(model, shape_dict={"x": [2, 16, 9, 11]}).mod).script()


@pytest.mark.parametrize("kernel, stride, pads, output_padding", CASES)
def test_transposed_convs_run_as_convolutions_and_match_onnxruntime(kernel, stride, pads, output_padding,
                                                                    tmp_path) -> None:
    model = conv_transpose(kernel, stride, pads, output_padding)
    script = _graph(model)
    assert "conv2d_transpose" not in script and "R.nn.conv2d(" in script
    engine = Engine(forge.from_onnx(model).compile(target="host", output_path=tmp_path / "a").path)
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 16, 9, 11)).astype(np.float32)
        expected = ort_run(model, {"x": x})[0]
        got = engine.infer(x)[0]
        assert got.shape == expected.shape
        assert_close(got, expected)


@needs_bf16
@pytest.mark.parametrize("kernel, stride, pads, output_padding", [CASES[1], CASES[4], CASES[7]])
def test_bf16_builds_run_transposed_convs_on_bf16_kernels(kernel, stride, pads, output_padding, tmp_path) -> None:
    import json

    model = conv_transpose(kernel, stride, pads, output_padding, cin=32, cout=32)
    result = forge.from_onnx(model).compile(target="host", output_path=tmp_path / "b", set_bfloat16=True,
                                            export_metadata=True)
    rules = json.loads((result.path / "compile_report.json").read_text())["schedule_rules"]
    assert "gemm_bf16" in rules.values(), rules
    x = np.random.default_rng(0).standard_normal((2, 32, 9, 11)).astype(np.float32)
    got, expected = Engine(result.path).infer(x)[0], ort_run(model, {"x": x})[0]
    cosine = float(np.dot(got.ravel(), expected.ravel()) / (np.linalg.norm(got) * np.linalg.norm(expected)))
    assert cosine >= 0.999 and not np.allclose(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kernel, stride, pads, output_padding", [CASES[4], CASES[6]])
def test_dynamic_height_and_width_stay_dynamic(kernel, stride, pads, output_padding, tmp_path) -> None:
    """The reshape and the crop take the symbolic sizes: one artifact for every input size."""
    model = conv_transpose(kernel, stride, pads, output_padding)
    for dim, name in zip(model.graph.input[0].type.tensor_type.shape.dim[2:], ("H", "W")):
        dim.dim_param = name
    for dim, name in zip(model.graph.output[0].type.tensor_type.shape.dim[2:], ("OH", "OW")):
        dim.dim_param = name
    engine = Engine(forge.from_onnx(model).compile(target="host", output_path=tmp_path / "d").path)
    for size in [(9, 11), (6, 13)]:
        x = np.random.default_rng(0).standard_normal((1, 16, *size)).astype(np.float32)
        expected = ort_run(model, {"x": x})[0]
        got = engine.infer(x)[0]
        assert got.shape == expected.shape
        assert_close(got, expected)


def _phase_conv_weights(model: onnx.ModelProto) -> list[tuple[int, ...]]:
    """The weight shapes of the convolutions the rewrite makes (OIHW, before NHWC)."""
    from tvm import relax

    from forgekit.passes.conv_transpose import conv_transpose_as_conv

    shapes: list[tuple[int, ...]] = []

    @relax.expr_functor.visitor
    class Convs(relax.PyExprVisitor):
        def visit_call_(self, call) -> None:  # noqa: ANN001
            if getattr(call.op, "name", "") == "relax.nn.conv2d":
                shapes.append(tuple(call.args[1].value.numpy().shape))

    mod = conv_transpose_as_conv(forge.from_onnx(model, shape_dict={"x": [2, 16, 9, 11]}).mod)
    Convs().visit_expr(mod["main"])
    return shapes


@pytest.mark.parametrize("kernel, stride, pads, output_padding, expected", [
    ((3, 2, (1, 1, 1, 1), 1, [(24, 16, 2, 2), (24, 16, 2, 1), (24, 16, 1, 2), (24, 16, 1, 1)])),
    ((3, 2, (0, 0, 0, 0), 0, [(24, 16, 2, 2), (24, 16, 2, 1), (24, 16, 1, 2), (24, 16, 1, 1)])),
    ((4, 2, (1, 1, 1, 1), 0, [(96, 16, 2, 2)])),  # every phase has 2x2 real taps: one conv
    ((3, 2, (2, 2, 2, 2), 1, [(96, 16, 2, 2)])),  # dropping the taps would need negative padding
    ((1, 2, (0, 0, 0, 0), 1, [(96, 16, 1, 1)])),  # phases without a tap: their zeros stay one conv
])
def test_phases_with_fewer_taps_get_their_own_convs(kernel, stride, pads, output_padding, expected) -> None:
    """3x3/stride 2 as one 2x2 phase conv multiplied 16 taps per output quad for 9 real ones: its kernel ran at
    108.7 GFLOP/s of real MACs (128 -> 128 channels at 28x28, 2 threads of this Zen 4), a tap-for-tap conv at
    ~200.  One conv per phase over its real taps: 2x2, 2x1, 1x2, 1x1, exactly the ConvTranspose's multiplies
    (bench/bench_conv_transpose.py).  The results match onnxruntime (CASES, and the fallbacks here)."""
    model = conv_transpose(kernel, stride, pads, output_padding)
    assert _phase_conv_weights(model) == expected
    if len(expected) > 1:  # split: as many weights as the ConvTranspose's, not one zero tap
        assert sum(int(np.prod(s)) for s in expected) == 16 * 24 * kernel * kernel


@pytest.mark.parametrize("kernel, stride, pads, output_padding", [
    (3, 2, (2, 2, 2, 2), 1), (1, 2, (0, 0, 0, 0), 1), (3, 2, (0, 1, 2, 0), 0)])
def test_split_and_fallback_phases_match_onnxruntime(kernel, stride, pads, output_padding, tmp_path) -> None:
    model = conv_transpose(kernel, stride, pads, output_padding)
    engine = Engine(forge.from_onnx(model).compile(target="host", output_path=tmp_path / "s").path)
    x = np.random.default_rng(7).standard_normal((2, 16, 9, 11)).astype(np.float32)
    expected = ort_run(model, {"x": x})[0]
    got = engine.infer(x)[0]
    assert got.shape == expected.shape
    assert_close(got, expected)


@pytest.mark.skipif(host_arch() != "x86_64", reason="schedules for an x86-64 (Zen 4) target")
def test_bf16_phase_conv_of_a_prime_width_computes_whole_register_tiles(tmp_path) -> None:
    """A 2x2/stride-1 ConvTranspose on 28 columns is a 2x2 conv to 29: the bf16 kernel's register tile divided
    29 only as 1 column, each weight load feeding one vdpbf16ps (128 -> 128 channels at 28x28: 204 GFLOP/s, the
    28-wide Conv 431).  It computes 30 columns now (bf16.padded_width), the extra one sliced off: 2.0x."""
    import re

    import tvm

    from forgekit.backends.cpu import fusion_passes
    from forgekit.backends.cpu.registry import ApplyRules

    model = conv_transpose(2, 1, (0, 0, 0, 0), 0, cin=32, cout=32, size=(9, 28))
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})
    mod = forge.from_onnx(model, shape_dict={"x": [1, 32, 9, 28]}).mod
    with target:
        scheduled = tvm.transform.Sequential([*fusion_passes(target, True, True, True, True), ApplyRules(target)])(mod)
    scripts = [f.script() for gv, f in scheduled.functions.items() if "conv2d_bf16" in gv.name_hint]
    assert len(scripts) == 1
    lines = [ln for ln in scripts[0].splitlines() if re.search(r"conv2d_nhwc_bf16\w* = T\.sblock_alloc_buffer", ln)]
    assert [[int(d) for d in re.findall(r"T\.int64\((\d+)\)", ln)] for ln in lines] == [[1, 10, 30, 32]], lines
    if "avx512bf16" in host_features():
        result = forge.from_onnx(model).compile(target="host", output_path=tmp_path / "p", set_bfloat16=True)
        x = np.random.default_rng(0).standard_normal((2, 32, 9, 28)).astype(np.float32)
        got, expected = Engine(result.path).infer(x)[0], ort_run(model, {"x": x})[0]
        cosine = float(np.dot(got.ravel(), expected.ravel()) / (np.linalg.norm(got) * np.linalg.norm(expected)))
        assert got.shape == expected.shape and cosine >= 0.999
