"""Weights embedded as the library's read-only data and served without a copy (forgekit/backends/cpu/weights.py).

Before, the Relax VM deserialized every constant at load: the library's pages, two transient copies of the
executable's bytes and the constant pool held the weights four times (ResNet-50: 443 MB peak against
onnxruntime's 318 MB)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit as forge
from conftest import assert_close, ort_run
from forgekit.runtime import Engine


def _cnn(seed: int, fc: tuple[int, int] = (10, 64)) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((64, 32, 3, 3)) * 0.1).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "b"),
             numpy_helper.from_array((rng.standard_normal(fc) * 0.1).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "w2"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, fc[0]])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _exports_weight_function(library) -> bool:
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True).stdout
    return "__tvm_ffi_forgekit_weight" in symbols


@pytest.mark.parametrize("opt_level", [3, 4])
def test_lifted_weights_give_onnxruntimes_outputs(opt_level, tmp_path) -> None:
    model = _cnn(0)
    x = np.random.default_rng(1).standard_normal((1, 32, 16, 16)).astype(np.float32)
    result = forge.from_onnx(model).compile(target="host", output_path=tmp_path / "a", opt_level=opt_level)
    assert _exports_weight_function(result.library)
    assert_close(Engine(result.path).infer(x)[0], ort_run(model, {"x": x})[0])


def test_levels_below_3_keep_the_executables_constants(tmp_path) -> None:
    result = forge.from_onnx(_cnn(0)).compile(target="host", output_path=tmp_path / "a", opt_level=2)
    assert not _exports_weight_function(result.library)


def test_two_models_in_one_process_each_see_their_own_weights(tmp_path) -> None:
    """The embedded blob and its table are hidden symbols: a second library of the same layout must not
    resolve to the first one's weights."""
    x = np.random.default_rng(1).standard_normal((1, 32, 16, 16)).astype(np.float32)
    engines, models = [], []
    for seed in (0, 1):
        models.append(_cnn(seed))
        engines.append(Engine(forge.from_onnx(models[-1]).compile(target="host", output_path=tmp_path / str(seed)).path))
    for engine, model in zip(engines, models):
        assert_close(engine.infer(x)[0], ort_run(model, {"x": x})[0])


def test_an_encrypted_artifact_serves_its_weights_from_the_decrypted_memory_file(tmp_path) -> None:
    model = _cnn(2)
    x = np.random.default_rng(1).standard_normal((1, 32, 16, 16)).astype(np.float32)
    result = forge.from_onnx(model).compile(target="host", output_path=tmp_path / "enc", encrypt_password="weights stay secret")
    assert_close(Engine(result.path, password="weights stay secret").infer(x)[0], ort_run(model, {"x": x})[0])


def test_peak_memory_holds_the_weights_about_once(tmp_path) -> None:
    """A 32 MB matrix: loading and running the artifact raises the process's peak by ~1x the weights (the
    library's pages); the VM's constant pool made it ~4x."""
    rng = np.random.default_rng(0)
    k, n = 2048, 4096
    w = numpy_helper.from_array((rng.standard_normal((k, n)) / 45).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "big",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, n])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result = forge.from_onnx(model).compile(target="host", output_path=tmp_path / "big")
    probe = textwrap.dedent(f"""
        import json, sys
        sys.modules["torch"] = None
        import numpy as np
        from forgekit.runtime import Engine, ensure_runtime
        from forgekit.memory import peak_rss_mb
        ensure_runtime()
        before = peak_rss_mb()
        engine = Engine({str(result.path)!r})
        y = engine.infer(np.ones((4, {k}), np.float32))[0]
        print(json.dumps({{"before": before, "after": peak_rss_mb(), "y": float(y[0, 0])}}))
    """)
    out = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout)
    weights_mb = k * n * 4 / 2**20
    growth = out["after"] - out["before"]
    assert growth < 1.6 * weights_mb, (growth, weights_mb)  # was ~4x: 130+ MB for these 32 MB
    assert out["y"] == pytest.approx(float(numpy_helper.to_array(w)[:, 0].astype(np.float64).sum()), rel=1e-4, abs=1e-4)
