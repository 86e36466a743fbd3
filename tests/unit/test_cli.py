"""The forgekit binary, run in a subprocess: happy paths and every user error (forgekit/cli.py)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from conftest import make_unsupported_model, run_cli


def _one_line_error(proc, code: int, *fragments: str) -> None:
    assert proc.returncode == code, proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_version_and_help() -> None:
    assert run_cli("--version").stdout.startswith("forgekit ")
    help_text = run_cli("--help").stdout
    for verb in ("inspect", "compile", "run", "targets"):
        assert verb in help_text


def test_inspect_table_and_json(convnet_path) -> None:
    table = run_cli("inspect", str(convnet_path))
    assert table.returncode == 0 and "input" in table.stdout and "nn.conv2d" in table.stdout
    data = json.loads(run_cli("inspect", str(convnet_path), "--json", "-").stdout)
    assert data["inputs"] == [{"name": "input", "shape": ["N", 3, 16, 16], "dtype": "float32"}]
    assert data["operators"]["nn.conv2d"] == 1 and len(data["fingerprint"]) == 64
    pinned = json.loads(run_cli("inspect", str(convnet_path), "--json", "-", "--input-shape", "input=4x3x16x16").stdout)
    assert pinned["inputs"][0]["shape"] == [4, 3, 16, 16]


def test_compile_run_save(convnet_path, tmp_path) -> None:
    out = tmp_path / "art"
    proc = run_cli("compile", str(convnet_path), "--target", "host", "-o", str(out), "--input-shape",
                   "input=2x3x16x16", "--export-ir", "--export-metadata", "--uuid",
                   "12345678-1234-4234-8234-123456789abc")
    assert proc.returncode == 0, proc.stderr
    assert "artifact:" in proc.stdout and (out / "model_library.so").exists() and (out / "model.relax.py").exists()
    # the summary: kernels by the rule that scheduled them (as compile_report.json has them), where it runs
    rules = json.loads((out / "compile_report.json").read_text())["schedule_rules"]
    assert f"kernels:  {len(rules)} scheduled by forgekit's rules (" in proc.stdout and "conv2d 1" in proc.stdout
    assert "runs on:  x86-64" in proc.stdout
    assert json.loads((out / "metadata.json").read_text())["uuid"] == "12345678-1234-4234-8234-123456789abc"

    x = np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    saved = tmp_path / "y.npz"
    run = run_cli("run", str(out), "--input", f"input={tmp_path / 'x.npy'}", "--save", str(saved), "--bench", "3")
    assert run.returncode == 0, run.stderr
    assert "probs: 2x10 float32" in run.stdout and "latency: median" in run.stdout
    from conftest import assert_close, ort_run

    assert_close(np.load(saved)["probs"], ort_run(onnx.load(convnet_path), {"input": x})[0])
    rand = run_cli("run", str(out), "--random", "--bench", "0")
    assert rand.returncode == 0 and "probs" in rand.stdout


def test_leip_spellings(convnet_path, tmp_path) -> None:
    out = tmp_path / "leip"
    proc = run_cli("compile", "--input_path", str(convnet_path), "--output_path", str(out), "--layout", "NHWC",
                   "--target", "llvm -mcpu=skylake -mattr=+avx2", "--input_shape", "input=1x3x16x16")
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["model"]["layout"] == "NHWC" and meta["build"]["target"]["mcpu"] == "skylake"


def test_targets_listing() -> None:
    arm = run_cli("targets", "--family", "arm")
    assert arm.returncode == 0 and "raspberry-pi/5" in arm.stdout.split()
    verbose = run_cli("targets", "--family", "android", "--strings")
    assert "aarch64-linux-android" in verbose.stdout
    _one_line_error(run_cli("targets", "--family", "mips"), 2, "Unknown family")


# ----------------------------------------------------------------------------- errors
def test_missing_model(tmp_path) -> None:
    _one_line_error(run_cli("compile", str(tmp_path / "nope.onnx"), "-o", str(tmp_path / "o")), 3, "does not exist")
    assert not (tmp_path / "o").exists()


def test_corrupt_model(tmp_path) -> None:
    bad = tmp_path / "corrupt.onnx"
    bad.write_bytes(b"\x08\x07garbage" * 50)
    _one_line_error(run_cli("inspect", str(bad)), 3, "not a valid ONNX model")


def test_unsupported_ops_listed(tmp_path) -> None:
    path = tmp_path / "unsupported.onnx"
    onnx.save(make_unsupported_model(), path)
    _one_line_error(run_cli("compile", str(path), "-o", str(tmp_path / "o")), 4,
                    "DeformConv (deform_a, deform_b)", "com.microsoft.FusedConv (fused)")


def test_inspect_check(convnet_path, tmp_path) -> None:
    """--check lists every unsupported node and dynamic input without importing; exit 4 when blocked."""
    model = make_unsupported_model()
    model.graph.input.append(onnx.helper.make_tensor_value_info("tokens", onnx.TensorProto.INT64, [1, "seq"]))
    path = tmp_path / "unsupported.onnx"
    onnx.save(model, path)
    proc = run_cli("inspect", str(path), "--check")
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stderr
    assert "unsupported: DeformConv (2): deform_a, deform_b" in proc.stdout
    assert "unsupported: com.microsoft.FusedConv (1): fused" in proc.stdout
    assert "dynamic input: tokens [1xseq] (kept dynamic; pin it with --input-shape tokens=" in proc.stdout
    data = json.loads(run_cli("inspect", str(path), "--check", "--json", "-", "--input-shape", "seq=16").stdout)
    assert data["unsupported"][0] == {"op": "DeformConv", "node": "deform_a"} and data["dynamic_inputs"] == []
    ok = run_cli("inspect", str(convnet_path), "--check")
    assert ok.returncode == 0 and "every operator is supported" in ok.stdout, ok.stderr
    _one_line_error(run_cli("inspect", str(path), "--check", "--input-shape", "nope=1x2"), 2, "model's inputs are")


def test_bad_target(convnet_path, tmp_path) -> None:
    _one_line_error(run_cli("compile", str(convnet_path), "--target", "raspbery-pi/5", "-o", str(tmp_path / "o")),
                    5, "Did you mean: raspberry-pi/5")
    assert not (tmp_path / "o").exists()


def test_wrong_input_shape(convnet_compiled, tmp_path) -> None:
    np.save(tmp_path / "small.npy", np.zeros((1, 3, 8, 8), np.float32))
    _one_line_error(run_cli("run", str(convnet_compiled), "--input", f"input={tmp_path / 'small.npy'}"), 9,
                    "the model expects 2x3x16x16")
    _one_line_error(run_cli("run", str(convnet_compiled)), 2, "--random")
    _one_line_error(run_cli("run", str(convnet_compiled), "--input", str(tmp_path / "absent.npy")), 9, "does not exist")


def test_output_exists(convnet_path, tmp_path) -> None:
    out = tmp_path / "exists"
    assert run_cli("compile", str(convnet_path), "-o", str(out)).returncode == 0
    _one_line_error(run_cli("compile", str(convnet_path), "-o", str(out)), 8, "--force")
    assert run_cli("compile", str(convnet_path), "-o", str(out), "--force").returncode == 0
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "old.txt").write_text("keep me")
    _one_line_error(run_cli("compile", str(convnet_path), "-o", str(mine), "--force"), 8, "not a forgekit artifact")
    assert (mine / "old.txt").read_text() == "keep me"


def test_missing_artifact(tmp_path) -> None:
    _one_line_error(run_cli("run", str(tmp_path / "none"), "--random"), 7, "does not exist")


def test_debug_shows_traceback(tmp_path) -> None:
    proc = run_cli("--debug", "inspect", str(tmp_path / "nope.onnx"))
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "ModelLoadError" in proc.stderr


def test_github_annotation(tmp_path) -> None:
    proc = run_cli("inspect", str(tmp_path / "nope.onnx"), env={"GITHUB_ACTIONS": "true"})
    assert proc.returncode == 3 and proc.stderr.startswith("::error::forgekit: Model file")


@pytest.mark.parametrize("name", ["squeezenet"])
def test_sample_models(name, tmp_path) -> None:
    out = tmp_path / name
    assert run_cli("compile", f"sample:{name}", "-o", str(out)).returncode == 0
    run = run_cli("run", str(out), "--random", "--bench", "2")
    assert run.returncode == 0 and "top5=" in run.stdout
    _one_line_error(run_cli("inspect", "sample:resnet5"), 3, "Did you mean: resnet50")


def test_encrypted_compile_and_run(convnet_path, tmp_path) -> None:
    out = tmp_path / "enc"
    env = {"FORGEKIT_ENCRYPT_PASSWORD": "s3cret pass"}
    proc = run_cli("compile", str(convnet_path), "-o", str(out), "--encrypt", env=env)
    assert proc.returncode == 0, proc.stderr
    assert (out / "modelKey.bin").exists() and "s3cret" not in proc.stdout + proc.stderr
    ok = run_cli("run", str(out), "--random", "--bench", "0", env=env)
    assert ok.returncode == 0 and "probs" in ok.stdout, ok.stderr
    pw = tmp_path / "pw.txt"
    pw.write_text("s3cret pass\n")
    assert run_cli("run", str(out), "--random", "--bench", "0", "--password-file", str(pw),
                   "--key", str(out / "modelKey.bin")).returncode == 0
    _one_line_error(run_cli("run", str(out), "--random", env={"FORGEKIT_ENCRYPT_PASSWORD": "wrong"}), 11)
    _one_line_error(run_cli("run", str(out), "--random"), 11)  # no password anywhere, no terminal


def test_encrypt_decrypt_rekey_verbs(convnet_compiled, tmp_path) -> None:
    import shutil

    art = tmp_path / "art"
    shutil.copytree(convnet_compiled, art)
    plain_sha = json.loads((art / "metadata.json").read_text())["library"]["sha256"]
    env = {"FORGEKIT_ENCRYPT_PASSWORD": "first password"}
    assert run_cli("encrypt", str(art), env=env).returncode == 0
    meta = json.loads((art / "metadata.json").read_text())
    assert meta["library"]["encrypted"] is True and meta["library"]["sha256"] != plain_sha
    _one_line_error(run_cli("encrypt", str(art), env=env), 2, "already encrypted")
    rekeyed = run_cli("rekey", str(art / "modelKey.bin"), env={**env, "FORGEKIT_NEW_ENCRYPT_PASSWORD": "second password"})
    assert rekeyed.returncode == 0, rekeyed.stderr
    _one_line_error(run_cli("run", str(art), "--random", env=env), 11)  # old password no longer works
    assert run_cli("run", str(art), "--random", "--bench", "0", env={"FORGEKIT_ENCRYPT_PASSWORD": "second password"}).returncode == 0
    out = tmp_path / "plain"
    dec = run_cli("decrypt", str(art), "-o", str(out), env={"FORGEKIT_ENCRYPT_PASSWORD": "second password"})
    assert dec.returncode == 0, dec.stderr
    assert json.loads((out / "metadata.json").read_text())["library"]["sha256"] == plain_sha
    assert (out / "model_library.so").read_bytes() == (convnet_compiled / "model_library.so").read_bytes()
    _one_line_error(run_cli("decrypt", str(art), "-o", str(tmp_path / "x"), env=env), 11)
    assert not (tmp_path / "x").exists()
