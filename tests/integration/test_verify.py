"""forgekit verify: artifacts run on their own architecture (aarch64 under qemu) against onnxruntime.

The qemu tests are slow: the first one builds the cached arm64 Debian rootfs (minutes, once per machine:
it lives in ~/.cache/forgekit/rootfs), then each aarch64 run takes seconds under emulation.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit
from forgekit.errors import NotAvailableError, ToolchainError, VerificationError
from forgekit.evaluate.compare import compare
from forgekit.evaluate.verify import verify_artifact

from conftest import make_convnet, make_two_output_model, run_cli

PI_TARGETS = ("raspberry-pi/5", "raspberry-pi/4")
CAN_EMULATE = (os.geteuid() == 0 and all(shutil.which(t) for t in ("debootstrap", "qemu-aarch64-static"))
               and shutil.which("aarch64-linux-gnu-g++") is not None)
needs_qemu = pytest.mark.skipif(not CAN_EMULATE, reason="needs root, debootstrap, qemu-user-static and "
                                "g++-aarch64-linux-gnu (./dev.sh test installs them)")


def make_transformer(seq: int = 16, hidden: int = 32, heads: int = 2, vocab: int = 50, seed: int = 3) -> onnx.ModelProto:
    """A one-layer BERT-style encoder: token + position embeddings, 2-head self-attention with an
    additive padding mask, LayerNorm, an Erf-GELU FFN.  Inputs input_ids and attention_mask (int64 1xS)."""
    rng = np.random.default_rng(seed)
    dh = hidden // heads

    def t(name: str, array: np.ndarray) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(array, np.float32) if array.dtype.kind == "f" else array, name)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    inits = [t("tok", w(vocab, hidden)), t("pos", w(seq, hidden)), t("wq", w(hidden, hidden)), t("wk", w(hidden, hidden)),
             t("wv", w(hidden, hidden)), t("wo", w(hidden, hidden)), t("w1", w(hidden, 4 * hidden)),
             t("b1", rng.standard_normal(4 * hidden).astype(np.float32) * 0.1), t("w2", w(4 * hidden, hidden)),
             t("g1", np.ones(hidden, np.float32)), t("be1", np.zeros(hidden, np.float32)),
             t("g2", rng.uniform(0.5, 1.5, hidden).astype(np.float32)), t("be2", np.zeros(hidden, np.float32)),
             t("heads_shape", np.array([1, seq, heads, dh], np.int64)), t("flat_shape", np.array([1, seq, hidden], np.int64)),
             t("scale", np.array(1 / np.sqrt(dh), np.float32)), t("one", np.array(1.0, np.float32)),
             t("neg", np.array(-1e4, np.float32)), t("half", np.array(0.5, np.float32)),
             t("rsqrt2", np.array(np.sqrt(0.5), np.float32)), t("mask_axes", np.array([1, 2], np.int64))]
    n = helper.make_node
    nodes = [
        n("Gather", ["tok", "input_ids"], ["emb"]), n("Add", ["emb", "pos"], ["x"]),
        n("MatMul", ["x", "wq"], ["q0"]), n("Reshape", ["q0", "heads_shape"], ["q1"]),
        n("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
        n("MatMul", ["x", "wk"], ["k0"]), n("Reshape", ["k0", "heads_shape"], ["k1"]),
        n("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
        n("MatMul", ["x", "wv"], ["v0"]), n("Reshape", ["v0", "heads_shape"], ["v1"]),
        n("Transpose", ["v1"], ["v"], perm=[0, 2, 1, 3]),
        n("MatMul", ["q", "kt"], ["s0"]), n("Mul", ["s0", "scale"], ["s1"]),
        n("Cast", ["attention_mask"], ["mf"], to=TensorProto.FLOAT), n("Sub", ["one", "mf"], ["minv"]),
        n("Mul", ["minv", "neg"], ["mb0"]), n("Unsqueeze", ["mb0", "mask_axes"], ["mb"]),
        n("Add", ["s1", "mb"], ["s"]), n("Softmax", ["s"], ["a"], axis=-1),
        n("MatMul", ["a", "v"], ["c0"]), n("Transpose", ["c0"], ["c1"], perm=[0, 2, 1, 3]),
        n("Reshape", ["c1", "flat_shape"], ["c"]), n("MatMul", ["c", "wo"], ["o"]), n("Add", ["o", "x"], ["r1"]),
        n("LayerNormalization", ["r1", "g1", "be1"], ["h"], axis=-1, epsilon=1e-5),
        n("MatMul", ["h", "w1"], ["f0"]), n("Add", ["f0", "b1"], ["f1"]), n("Mul", ["f1", "rsqrt2"], ["f2"]),
        n("Erf", ["f2"], ["f3"]), n("Add", ["f3", "one"], ["f4"]), n("Mul", ["f1", "f4"], ["f5"]),
        n("Mul", ["f5", "half"], ["gelu"]), n("MatMul", ["gelu", "w2"], ["f6"]), n("Add", ["f6", "h"], ["r2"]),
        n("LayerNormalization", ["r2", "g2", "be2"], ["last_hidden_state"], axis=-1, epsilon=1e-5),
    ]
    graph = helper.make_graph(
        nodes, "tiny_encoder",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, seq])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [1, seq, hidden])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="forgekit-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


MODELS = {
    "convnet": (make_convnet, {"input": [2, 3, 16, 16]}),
    "transformer": (make_transformer, None),
}


@pytest.fixture(scope="session")
def model_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("verify_models")
    out = {}
    for name, (make, _) in MODELS.items():
        out[name] = folder / f"{name}.onnx"
        onnx.save(make(), out[name])
    out["convnet_other_weights"] = folder / "convnet_other_weights.onnx"
    onnx.save(make_convnet(seed=1), out["convnet_other_weights"])
    out["two_output"] = folder / "two_output.onnx"
    onnx.save(make_two_output_model(), out["two_output"])
    return out


# --------------------------------------------------------------------------- comparison
def test_compare_reports_errors_and_counts_mismatches() -> None:
    ref = np.array([0.0, 1.0, -2.0, 4.0], np.float32)
    near = compare("y", ref + np.float32(1e-5), ref)
    assert near.ok and near.max_abs == pytest.approx(1e-5, rel=1e-2) and near.tolerance == pytest.approx(4e-4)
    off = compare("y", ref + np.array([0, 0, 0, 0.1], np.float32), ref)
    assert not off.ok and off.mismatched == 1 and off.max_abs == pytest.approx(0.1, rel=1e-5)
    assert off.max_rel == pytest.approx(0.1 / 4, rel=1e-5)
    nan = compare("y", np.array([np.nan, 1, -2, 4], np.float32), ref)
    assert not nan.ok and nan.mismatched == 1 and nan.max_abs == float("inf")
    ints = compare("ids", np.array([1, 2, 4]), np.array([1, 2, 3]))
    assert not ints.ok and ints.mismatched == 1
    shape = compare("y", np.zeros(3, np.float32), ref)
    assert not shape.ok and "shape" in shape.note


# --------------------------------------------------------------------------- native
def test_native_artifact_verifies(convnet_compiled: Path, convnet_path: Path, tmp_path: Path) -> None:
    result = verify_artifact(convnet_compiled, convnet_path)
    assert result.ok and result.runner == "native" and result.arch == os.uname().machine
    assert [o.name for o in result.outputs] == ["probs"] and result.outputs[0].max_abs < 1e-5
    out = run_cli("verify", str(convnet_compiled), "--onnx", str(convnet_path), "--json", str(tmp_path / "v.json"))
    assert out.returncode == 0, out.stderr
    assert "probs: 2x10 max abs err" in out.stdout and "verified: outputs match onnxruntime" in out.stdout
    assert json.loads((tmp_path / "v.json").read_text())["ok"] is True


def test_native_transformer_with_int_inputs_verifies(model_files: dict[str, Path], tmp_path: Path) -> None:
    """input_ids get integers, attention_mask 0/1: the seeded inputs follow the metadata's dtypes."""
    out = tmp_path / "encoder"
    forgekit.from_onnx(model_files["transformer"]).compile(target="host", output_path=out)
    result = verify_artifact(out, model_files["transformer"])
    assert result.ok and result.outputs[0].shape == [1, 16, 32] and result.outputs[0].max_abs < 1e-4


def test_mismatch_exits_13_with_one_line(convnet_compiled: Path, model_files: dict[str, Path]) -> None:
    """Same inputs and outputs, other weights: the artifact is not that model."""
    result = verify_artifact(convnet_compiled, model_files["convnet_other_weights"])
    assert not result.ok and result.outputs[0].max_abs > 1e-2
    with pytest.raises(VerificationError, match="differ from onnxruntime"):
        result.check()
    out = run_cli("verify", str(convnet_compiled), "--onnx", str(model_files["convnet_other_weights"]))
    assert out.returncode == VerificationError.exit_code == 13
    assert "MISMATCH" in out.stdout
    assert out.stderr.startswith("error: 1 of 1 output(s)") and len(out.stderr.strip().splitlines()) == 1


def test_model_with_other_inputs_is_refused(convnet_compiled: Path, model_files: dict[str, Path]) -> None:
    out = run_cli("verify", str(convnet_compiled), "--onnx", str(model_files["two_output"]))
    assert out.returncode == 9 and "Traceback" not in out.stderr  # InputError: the inputs do not match
    assert "the model the artifact was compiled from" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_unknown_architecture_is_not_available(convnet_compiled: Path, convnet_path: Path, tmp_path: Path) -> None:
    art = tmp_path / "riscv"
    shutil.copytree(convnet_compiled, art)
    meta = json.loads((art / "metadata.json").read_text())
    meta["build"]["arch"] = "riscv64"
    (art / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(NotAvailableError, match="cannot emulate 'riscv64'"):
        verify_artifact(art, convnet_path)


def test_missing_debootstrap_names_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from forgekit.devices import rootfs as qemu

    monkeypatch.setenv("FORGEKIT_CACHE", str(tmp_path))  # no cached rootfs: it would have to be built
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ToolchainError, match="install the Debian package 'debootstrap'"):
        qemu.ensure_rootfs("aarch64")
    assert not any(tmp_path.rglob("*"))  # nothing half-built


# --------------------------------------------------------------------------- aarch64 under qemu
@pytest.fixture(scope="session")
def arm64_rootfs() -> Path:
    """The cached arm64 rootfs, built on first use (minutes) and reused by every later session."""
    from forgekit.devices import rootfs as qemu

    return qemu.ensure_rootfs("aarch64", log=print)


@pytest.fixture(scope="session")
def pi_artifacts(model_files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Each model compiled once per Raspberry Pi target (compiled lazily, shared by the tests)."""
    cache: dict = {}

    def get(model: str, target: str, encrypt: str | None = None) -> Path:
        key = (model, target, encrypt)
        if key not in cache:
            out = tmp_path_factory.mktemp("pi") / f"{model}-{target.replace('/', '-')}"
            forgekit.from_onnx(model_files[model], MODELS[model][1]).compile(
                target=target, output_path=out, encrypt_password=encrypt)
            cache[key] = out
        return cache[key]

    return get


@pytest.mark.slow
@needs_qemu
@pytest.mark.parametrize("target", PI_TARGETS)
@pytest.mark.parametrize("model", sorted(MODELS))
def test_pi_artifact_runs_under_qemu_and_matches(model, target, arm64_rootfs, pi_artifacts, model_files) -> None:
    artifact = pi_artifacts(model, target)
    assert json.loads((artifact / "metadata.json").read_text())["build"]["arch"] == "aarch64"
    result = verify_artifact(artifact, model_files[model])
    print(f"{model} {target}: " + "; ".join(o.line() for o in result.outputs) + f" ({result.run_seconds:.1f} s)")
    assert result.runner == "qemu-aarch64" and result.target == target
    assert result.ok, [o.line() for o in result.outputs]
    assert all(o.max_abs < 1e-3 for o in result.outputs)


@pytest.mark.slow
@needs_qemu
def test_cli_verifies_pi_artifact_and_detects_mismatch_under_qemu(arm64_rootfs, pi_artifacts, model_files) -> None:
    artifact = pi_artifacts("convnet", "raspberry-pi/5")
    good = run_cli("verify", str(artifact), "--onnx", str(model_files["convnet"]))
    assert good.returncode == 0, good.stderr
    assert "qemu-aarch64" in good.stdout and "verified" in good.stdout
    bad = run_cli("verify", str(artifact), "--onnx", str(model_files["convnet_other_weights"]))
    assert bad.returncode == 13 and len(bad.stderr.strip().splitlines()) == 1 and "MISMATCH" in bad.stdout


@pytest.mark.slow
@needs_qemu
def test_encrypted_pi_artifact_is_decrypted_on_the_host(arm64_rootfs, pi_artifacts, model_files, tmp_path) -> None:
    artifact = pi_artifacts("convnet", "raspberry-pi/5", encrypt="correct horse")
    assert (artifact / "modelKey.bin").exists()
    assert verify_artifact(artifact, model_files["convnet"], password="correct horse").ok
    (tmp_path / "pw").write_text("correct horse\n")
    out = run_cli("verify", str(artifact), "--onnx", str(model_files["convnet"]), "--password-file", str(tmp_path / "pw"))
    assert out.returncode == 0, out.stderr


@pytest.mark.slow
@needs_qemu
@pytest.mark.parametrize("target", PI_TARGETS)
@pytest.mark.parametrize("activation", ["QInt8", "QUInt8"])
def test_int8_pi_artifact_matches_onnxruntime_under_qemu(activation, target, arm64_rootfs, tmp_path) -> None:
    """An onnxruntime QDQ model on the aarch64 integer kernels (sdot on the Pi 5, generic integer code on the
    Pi 4), run under qemu: the integer path is exact, so it matches onnxruntime's own int8 run."""
    from forgekit.backends import cpu as schedules
    from onnx_models import ort_qdq_cnn

    qdq = ort_qdq_cnn(tmp_path, activation)
    schedules.STATS.clear()
    artifact = forgekit.from_onnx(qdq).compile(target=target, output_path=tmp_path / "art").path
    uses_sdot = list(schedules.STATS.values()).count("gemm_int8_sdot")
    assert uses_sdot == (3 if target == "raspberry-pi/5" else 0)  # two convs and the matmul
    result = verify_artifact(artifact, qdq, rtol=0, atol=1e-5)
    assert result.runner == "qemu-aarch64" and result.ok, [o.line() for o in result.outputs]


@pytest.mark.slow
@needs_qemu
def test_portable_aarch64_int8_artifact_loads_sdot_where_the_cpu_has_it(arm64_rootfs, tmp_path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """arm/aarch64 builds an int8 model twice (ARMv8.2 sdot kernels and plain ARMv8-A) into one artifact; under
    qemu's default CPU (which has dot product) the sdot level is loaded, on an emulated Cortex-A53 (ARMv8.0,
    no dot product) the baseline, and both match onnxruntime's int8 run exactly."""
    from onnx_models import ort_qdq_cnn

    qdq = ort_qdq_cnn(tmp_path, "QInt8")
    artifact = forgekit.from_onnx(qdq).compile(target="arm/aarch64", output_path=tmp_path / "art").path
    levels = [v["name"] for v in json.loads((artifact / "metadata.json").read_text())["library"]["variants"]]
    assert levels == ["armv8.2-dotprod", "armv8-a"]
    for cpu, level in ((None, "armv8.2-dotprod"), ("cortex-a53", "armv8-a")):
        if cpu:
            monkeypatch.setenv("QEMU_CPU", cpu)
        result = verify_artifact(artifact, qdq, rtol=0, atol=1e-5)
        assert result.runner == "qemu-aarch64" and result.level == level, (cpu, result.level)
        assert result.ok, [o.line() for o in result.outputs]
