"""Portable targets: several instruction-set levels in one artifact, the best chosen at load time
(forgekit/targets/variants.py, runtime/compat.py choose_library, artifact writer/encryption, publish).

The emulated-CPU runs (Haswell picks x86-64-v3, Nehalem x86-64-v2) are in tests/integration/test_cpu_compat.py."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_close, ort_run

import forgekit
from forgekit.errors import IncompatibleArtifactError, UsageError
from forgekit.runtime import Engine, compat
from forgekit.targets import parse_target
from forgekit.targets.variants import variants

V4 = {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


@pytest.mark.parametrize("text", ["x86-64", "llvm"])
def test_x86_portable_names_build_three_levels_over_a_v2_baseline(text: str) -> None:
    spec = parse_target(text)
    assert spec.levels and spec.target["mcpu"] == "x86-64-v2" and spec.family == "x86"
    built = variants(spec, quantized=False)
    assert [v.name for v in built] == ["x86-64-v4", "x86-64-v3", "x86-64-v2"]
    needs = [set(v.cpu_features) for v in built]
    assert needs[2] < needs[1] < needs[0]  # each level needs strictly more of a CPU than the next
    assert "sse4.2" in needs[2] and "avx" not in needs[2]
    assert {"avx2", "fma"} <= needs[1] and not needs[1] & V4
    assert V4 <= needs[0] and "avx512vnni" not in needs[0]
    assert set(spec.cpu_features()) == needs[2]


def test_quantized_models_also_get_the_vnni_level() -> None:
    built = variants(parse_target("x86-64"), quantized=True)
    assert built[0].name == "x86-64-v4-vnni" and "avx512vnni" in built[0].cpu_features
    arm = variants(parse_target("arm/aarch64"), quantized=True)
    assert [v.name for v in arm] == ["armv8.2-dotprod", "armv8-a"] and "dotprod" in arm[0].cpu_features
    assert [v.name for v in variants(parse_target("arm/aarch64"), quantized=False)] == ["armv8-a"]


@pytest.mark.parametrize("text", ["llvm -mcpu=skylake", "x86/avx2", "host", "raspberry-pi/5", "llvm -opt-level=3"])
def test_single_isa_targets_stay_single(text: str) -> None:
    spec = parse_target(text)
    assert spec.levels == () and [v.name for v in variants(spec, quantized=True)] == [None]


def test_the_default_target_is_portable() -> None:
    from forgekit.options import DEFAULT_TARGET
    from forgekit.runtime.cpu import host_arch

    if host_arch() == "x86_64":
        assert DEFAULT_TARGET == "x86-64" and parse_target(DEFAULT_TARGET).levels


# ---------------------------------------------------------------- choosing a level (no compile needed)
def _meta(tmp_path: Path) -> tuple[dict, Path]:
    levels = [("x86-64-v4", "model_library.x86-64-v4.so", ["avx2", "avx512f", "sse4.2"]),
              ("x86-64-v3", "model_library.x86-64-v3.so", ["avx2", "sse4.2"]),
              ("x86-64-v2", "model_library.so", ["sse4.2"])]
    meta = {"library": {"file": "model_library.so",
                        "variants": [{"name": n, "file": f, "cpu_features": c} for n, f, c in levels]}}
    return meta, tmp_path / "model_library.so"


@pytest.mark.parametrize(("cpu", "level"), [({"avx2", "avx512f", "sse4.2"}, "x86-64-v4"),
                                            ({"avx2", "sse4.2"}, "x86-64-v3"), ({"sse4.2"}, "x86-64-v2"),
                                            (set(), "x86-64-v2")])  # a CPU that cannot be asked: the baseline
def test_the_best_level_the_cpu_has_is_chosen(cpu: set, level: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat, "host_features", lambda: frozenset(cpu))
    monkeypatch.delenv(compat.LEVEL_ENV, raising=False)
    meta, library = _meta(tmp_path)
    path, chosen = compat.choose_library(meta, library)
    assert chosen == level and path.parent == tmp_path
    assert path.name == next(v["file"] for v in meta["library"]["variants"] if v["name"] == level)


def test_a_forced_level_must_exist_and_run_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat, "host_features", lambda: frozenset({"avx2", "sse4.2"}))
    meta, library = _meta(tmp_path)
    monkeypatch.setenv(compat.LEVEL_ENV, "x86-64-v2")
    assert compat.choose_library(meta, library)[1] == "x86-64-v2"
    monkeypatch.setenv(compat.LEVEL_ENV, "x86-64-v4")
    with pytest.raises(IncompatibleArtifactError, match="cannot run that level"):
        compat.choose_library(meta, library)
    monkeypatch.setenv(compat.LEVEL_ENV, "sse9")
    with pytest.raises(IncompatibleArtifactError, match="x86-64-v4, x86-64-v3, x86-64-v2"):
        compat.choose_library(meta, library)


def test_single_isa_artifacts_load_their_one_library(tmp_path: Path) -> None:
    assert compat.choose_library({"library": {"file": "model_library.so"}}, tmp_path / "x.so") == (tmp_path / "x.so",
                                                                                                   None)


# ---------------------------------------------------------------- real portable artifacts
@pytest.fixture(scope="module")
def portable(convnet_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("portable") / "enc"
    ir = forgekit.from_onnx(convnet_path, {"input": [2, 3, 16, 16]})
    return ir.compile(target="x86-64", output_path=out, encrypt_password="portable-password-1").path


def test_every_level_is_encrypted_under_one_key_and_computes_the_same(portable: Path, convnet_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from forgekit import crypto
    from forgekit.runtime.cpu import host_features

    meta = json.loads((portable / "metadata.json").read_text())
    files = [v["file"] for v in meta["library"]["variants"]]
    assert files == ["model_library.x86-64-v4.so", "model_library.x86-64-v3.so", "model_library.so"]
    assert all(crypto.is_encrypted(portable / f) for f in files)
    assert sorted(p.name for p in portable.glob("modelKey*")) == ["modelKey.bin"]
    x = np.random.default_rng(0).random((2, 3, 16, 16), dtype=np.float32)
    expected = ort_run(convnet_path, {"input": x})[0]
    runnable = [v["name"] for v in meta["library"]["variants"] if set(v["cpu_features"]) <= host_features()]
    for level in runnable:
        monkeypatch.setenv(compat.LEVEL_ENV, level)
        engine = Engine(portable, password="portable-password-1")
        assert engine.level == level and engine.library_path.name == f"model_library.{level}.so".replace(
            ".x86-64-v2", "")
        assert_close(engine.infer(x)[0], expected)
    monkeypatch.delenv(compat.LEVEL_ENV)
    assert Engine(portable, password="portable-password-1").level == runnable[0]


def test_decrypt_writes_every_level_and_publish_ships_them(portable: Path, tmp_path: Path) -> None:
    from forgekit import crypto
    from forgekit.artifact.encryption import decrypt_artifact
    from forgekit.release.publish import publish

    plain = decrypt_artifact(portable, tmp_path / "plain", "portable-password-1")
    meta = json.loads((plain / "metadata.json").read_text())
    assert meta["library"]["encrypted"] is False
    for entry in meta["library"]["variants"]:
        assert not crypto.is_encrypted(plain / entry["file"])
        from forgekit.artifact.layout import file_digest

        assert file_digest(plain / entry["file"])[0] == entry["sha256"]
    result = publish([plain], "1.0.0", tmp_path / "dist", name="convnet")
    with tarfile.open(result.bundles[0].archive) as tar:
        names = {Path(m.name).name for m in tar.getmembers()}
    assert {"model_library.so", "model_library.x86-64-v3.so", "model_library.x86-64-v4.so"} <= names
    # a level changed after compiling is refused like the baseline would be
    (plain / "model_library.x86-64-v3.so").write_bytes(b"tampered")
    with pytest.raises(forgekit.errors.ArtifactError, match="x86-64-v3.so' does not match the sha256"):
        publish([plain], "1.0.1", tmp_path / "dist2", name="convnet")


def test_tuning_a_portable_target_tunes_the_level_this_cpu_runs(convnet_path: Path, tmp_path: Path) -> None:
    from forgekit.compiler import _tuned_level
    from forgekit.runtime.cpu import host_features

    ir = forgekit.from_onnx(convnet_path, {"input": [2, 3, 16, 16]})
    result = ir.compile(target="x86-64", output_path=tmp_path / "t", tuning_trials=0, records=tmp_path / "records",
                        export_metadata=True)
    report = json.loads((result.path / "compile_report.json").read_text())
    best = next(v["name"] for v in result.metadata["library"]["variants"] if set(v["cpu_features"]) <= host_features())
    assert report["tuning"]["level"] == best
    # levels this machine cannot run cannot be measured here: one line
    arm = parse_target("arm/aarch64")
    with pytest.raises(UsageError, match="runs none of the levels of 'arm/aarch64'"):
        _tuned_level(arm, variants(arm, quantized=True))


def test_model_card_states_the_baseline_and_the_levels() -> None:
    from forgekit.release.model_card import requirements

    req = requirements({"arch": "x86_64", "cpu_features": ["popcnt", "sse4.2"],
                        "levels": ["x86-64-v4", "x86-64-v3", "x86-64-v2"]})
    assert req["runs_on"].startswith("x86-64 with SSE4.2 or better; levels x86-64-v4, x86-64-v3, x86-64-v2")
    assert "or better" not in requirements({"arch": "x86_64", "cpu_features": ["avx2"], "levels": []})["runs_on"]
