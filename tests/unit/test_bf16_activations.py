"""bf16 activations between layers (forgekit/backends/cpu/bf16_activations.py): which tensors are stored as bf16,
that the rounding and widening fuse into the kernels around them, and the results against fp32 onnxruntime."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest

import forgekit as forge
from conftest import ort_run
from forgekit.runtime import Engine
from forgekit.runtime.cpu import host_arch, host_features
from onnx_models import bottleneck

x86_only = pytest.mark.skipif(host_arch() != "x86_64", reason="compiles for an x86-64 target with this machine's linker")
needs_bf16 = pytest.mark.skipif("avx512bf16" not in host_features(),
                                reason="this CPU has no AVX512_BF16: bf16 artifacts compile but cannot run here")
ZNVER4 = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("bf16act") / "bottleneck.onnx"
    onnx.save(bottleneck(), path)
    return path


@pytest.fixture(scope="module")
def fused(model_path):
    """The bottleneck's fused PrimFuncs for a bf16 target: {name: TIR text}."""
    import tvm

    from forgekit.backends import cpu

    target = tvm.target.Target(ZNVER4)
    with target:
        mod = tvm.transform.Sequential(cpu.fusion_passes(target, bf16=True))(forge.from_onnx(model_path).mod)
    return {gv.name_hint: f.script() for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}


def _data_dtype(text: str) -> str:
    """The dtype of a PrimFunc's first parameter (a conv kernel's input), from its TVMScript."""
    return re.search(r'def main\(\w+: T\.Buffer\(\(.*?\), "(\w+)"\)', text).group(1)


@x86_only
def test_tensors_between_bf16_convs_are_stored_as_bf16(fused) -> None:
    """a, b and f are rounded by the kernels that compute them; e (read by a depthwise conv, fp32) and h (a
    model output) stay fp32; no kernel only rounds or only widens; the Winograd input transform reads a's bits."""
    rounding = sorted(name for name, text in fused.items() if '"round_bf16' in text)
    assert not any(name.startswith(("round_bf16", "widen_bf16")) for name in fused), sorted(fused)
    # the 1x1 conv computing a (fp32: 16 products), the Winograd output transform of b, the depthwise conv of f
    assert len(rounding) == 3, rounding
    assert sum(name.startswith("fused_winograd_output") for name in rounding) == 1, rounding
    widening = [name for name, text in fused.items() if '"widen_bf16' in text]
    assert len(widening) == 1 and "conv2d_bf16" in widening[0], widening  # the residual add reads a's bits
    assert _data_dtype(fused["winograd_input"]) == "uint16"


@x86_only
def test_a_conv_reading_bf16_without_padding_has_no_prologue(fused) -> None:
    """The 1x1 convs reading bf16 bits (e's, stride 1, and out2's, stride 2) read them as they are; the convs
    over fp32 tensors (out1's, padded, over e; out3's over the output h) round them in a prologue."""
    convs = {name: text for name, text in fused.items() if "conv2d_nhwc_bf16" in text}
    assert len(convs) == 4, sorted(convs)
    reading_bits = sorted(name for name, text in convs.items() if _data_dtype(text) == "uint16")
    with_prologue = sorted(name for name, text in convs.items() if '"data_bf16"' in text)
    assert len(reading_bits) == 2 and len(with_prologue) == 2, (reading_bits, with_prologue)
    assert not set(reading_bits) & set(with_prologue)


@x86_only
def test_every_kernel_keeps_its_rule(model_path, tmp_path) -> None:
    """A residual add that widens a's bits inside a conv's epilogue is still scheduled by the conv rules (the
    widening block made them refuse it; the kernel fell to the pool rule)."""
    result = forge.from_onnx(model_path).compile(target=ZNVER4, output_path=tmp_path / "a", set_bfloat16=True,
                                                 export_metadata=True)
    rules = json.loads((result.path / "compile_report.json").read_text())["schedule_rules"]
    for name, rule in rules.items():
        if "conv2d_bf16" in name:
            assert rule == "gemm_bf16", (name, rules)
        if name.startswith("fused_winograd_output"):
            assert rule == "winograd", (name, rules)


@needs_bf16
def test_results_match_fp32_onnxruntime(model_path, tmp_path) -> None:
    """Every output within bf16's cosine of fp32 onnxruntime; h, an output computed in fp32 that a bf16 conv
    also reads, is not rounded (fp32 tolerance)."""
    result = forge.from_onnx(model_path).compile(target="host", output_path=tmp_path / "a", set_bfloat16=True)
    engine = Engine(result.path)
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = rng.standard_normal((1, 16, 14, 14)).astype(np.float32)
        expected = ort_run(model_path, {"x": x})
        actual = engine.infer(x)
        for name, a, e in zip(("out1", "out2", "out3"), actual[:3], expected[:3]):
            cos = float(a.ravel().astype(np.float64) @ e.ravel() / np.linalg.norm(a) / np.linalg.norm(e))
            assert cos >= 0.999, (name, cos)
            assert not np.allclose(a, e, rtol=1e-5, atol=1e-5), name  # bf16 did run
        np.testing.assert_allclose(actual[3], expected[3], rtol=1e-5, atol=1e-5)
