"""``forgekit publish``: bundle layout, checksums, model card content, reproducibility, errors.

Artifacts are really compiled (the tiny convnet: host, host encrypted, and raspberry-pi/5 cross-linked),
latency comes from a real ``forgekit bench --json`` run, and the rendered MODEL_CARD.md/RELEASE_NOTES.md
are compared with golden files rendered from fixed metadata (the real ones hold machine-specific hashes).
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import run_cli
from test_metadata import CONTEXT

from forgekit.artifact import metadata as md
from forgekit.release import publish as pub
from forgekit.errors import ArtifactError, OutputExistsError, UsageError
from forgekit.release.model_card import card_context, release_context

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
EPOCH = "1700000000"  # 2023-11-14T22:13:20Z
PASSWORD = "publish test password"

# ----------------------------------------------------------------------------- fixed inputs for golden files
META = {  # the golden metadata of test_metadata, with a build as the publish tests had it
    "schema": "forgekit.artifact/1",
    **copy.deepcopy({k: v for k, v in CONTEXT.items() if k != "build"}),
    "build": {
        "opt_level": 3, "float16": False, "target": {"kind": "llvm", "mcpu": "znver4", "num-cores": 2},
        "host": {"kind": "llvm", "mcpu": "znver4"}, "target_name": "x86/znver4", "family": "x86",
        "triple": "x86_64-linux-gnu", "arch": "x86_64", "toolchain": {"linker": "g++", "linker_version": "g++ 12"},
        "device": {"os": "linux", "kind": "cpu"},
        "cpu_features": ["avx", "avx2", "avx512f", "avx512vnni", "fma", "sse", "sse2"],
        "compile_seconds": 1.5,
    },
}
BENCH = {
    "artifact": "/tmp/a", "threads": 2, "target": "x86/znver4", "compile_seconds": 1.5, "ratio": 0.5,
    "forgekit": {"runs": 20, "median_ms": 1.25, "p90_ms": 1.5, "mean_ms": 1.3, "min_ms": 1.0,
                 "throughput_per_s": 800.0, "peak_rss_mb": 61.2},
    "onnxruntime": {"runs": 20, "median_ms": 2.5, "p90_ms": 3.0, "mean_ms": 2.6, "min_ms": 2.0,
                    "throughput_per_s": 400.0, "peak_rss_mb": 80.0},
    "max_abs_error": 1.5e-7, "output_scale": 0.4, "outputs_match": True, "extra": {},
}
FILES = [{"name": "bench.json", "size": 600, "sha256": "01" * 32},
         {"name": "latency.svg", "size": 900, "sha256": "02" * 32},
         {"name": "metadata.json", "size": 1300, "sha256": "ef" * 32},
         {"name": "model_library.so", "size": 1234, "sha256": "ab" * 32}]


def _arm_quantized_meta() -> dict:
    """META for an encrypted int8 raspberry-pi/5 build, with the fields later metadata versions add."""
    meta = copy.deepcopy(META)
    meta["library"]["encrypted"] = True
    meta["model"]["precision"] = "int8"
    meta["build"].update({"target_name": "raspberry-pi/5", "family": "arm", "triple": "aarch64-linux-gnu",
                          "arch": "aarch64", "mcpu": "cortex-a76", "features": ["+neon", "+dotprod"],
                          "cpu_features": ["dotprod", "neon"], "target": {"kind": "llvm"}})
    meta["quantization"] = {"scheme": "int8 per-channel", "calibration_samples": 128,
                            "accuracy": {"top1": {"fp32": 0.761, "quantized": 0.755}}}
    return meta


def _golden_cards() -> tuple[dict, dict]:
    host = card_context(META, model_name="convnet", version="1.2.0", bundle="convnet-1.2.0-x86-znver4",
                        files=FILES, key_included=False, key_file="modelKey.bin", bench=BENCH, bench_source="bench.json",
                        chart="latency.svg")
    arm = card_context(_arm_quantized_meta(), model_name="convnet", version="1.2.0",
                       bundle="convnet-1.2.0-raspberry-pi-5", files=FILES[2:], key_included=False,
                       key_file="modelKey.bin")
    return host, arm


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("FORGEKIT_UPDATE_GOLDEN") == "1":  # regenerate on purpose after a template change
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed: set FORGEKIT_UPDATE_GOLDEN=1 to update tests/golden on purpose"


def test_model_card_matches_golden_file() -> None:
    host, _ = _golden_cards()
    text = md.render("MODEL_CARD.md.j2", **host)
    _check_golden("MODEL_CARD.md", text)
    assert "| forgekit | 20 | 1.250 | 1.500 | 1.000 | 800.0 | 61 |" in text
    assert "## Quantization" not in text  # no quantization section in the metadata: none rendered


def test_quantized_encrypted_model_card_matches_golden_file() -> None:
    _, arm = _golden_cards()
    text = md.render("MODEL_CARD.md.j2", **arm)
    _check_golden("MODEL_CARD_quantized.md", text)
    assert "| top1 | 0.761 | 0.755 | -0.006 |" in text
    assert "| cpu | cortex-a76 |" in text and "| features | +neon, +dotprod |" in text
    assert "Latency: not measured." in text and "ms" not in text.split("## Latency")[1].split("##")[0]


def test_release_notes_match_golden_file() -> None:
    host, arm = _golden_cards()
    context = release_context(model_name="convnet", version="1.2.0", date="2023-11-14", cards=[arm, host],
                              archives=["convnet-1.2.0-raspberry-pi-5.tar.gz", "convnet-1.2.0-x86-znver4.tar.gz"])
    _check_golden("RELEASE_NOTES.md", md.render("RELEASE_NOTES.md.j2", **context))


def test_templates_ship_inside_the_package() -> None:
    from importlib import resources

    for name in ("MODEL_CARD.md.j2", "RELEASE_NOTES.md.j2"):
        assert resources.files("forgekit.templates").joinpath(name).is_file()


def test_version_and_name_rules() -> None:
    assert pub.parse_version("v1.2.3-rc.1+build.5") == "1.2.3-rc.1+build.5"
    for bad in ("1.2", "latest", "1.2.3.4", "01.2.3", "1.2.3 ; rm -rf /"):
        with pytest.raises(UsageError):
            pub.parse_version(bad)
    assert pub.sanitize("raspberry-pi/5") == "raspberry-pi-5"
    assert pub.sanitize("cuda -arch=sm_90") == "cuda-arch-sm_90"


# ----------------------------------------------------------------------------- real artifacts
@pytest.fixture(scope="module")
def arts(convnet_path: Path, convnet_compiled: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """host (shared, plain), host encrypted, raspberry-pi/5 cross-linked; and a real bench JSON of host."""
    import forgekit

    base = tmp_path_factory.mktemp("publish-artifacts")
    ir = forgekit.from_onnx(convnet_path, {"input": [2, 3, 16, 16]})
    ir.compile(target="host", output_path=base / "encrypted", encrypt_password=PASSWORD)
    ir.compile(target="raspberry-pi/5", output_path=base / "rpi5")
    bench = base / "bench-host.json"
    proc = run_cli("bench", str(convnet_compiled), "--onnx", str(convnet_path), "-n", "3", "--warmup", "1",
                   "--no-memory", "--json", str(bench))
    assert proc.returncode == 0, proc.stderr
    return {"host": convnet_compiled, "encrypted": base / "encrypted", "rpi5": base / "rpi5", "bench": bench}


@pytest.fixture
def epoch(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)
    return int(EPOCH)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_per_target_bundles_layout_and_checksums(arts, epoch, tmp_path) -> None:
    result = pub.publish([arts["rpi5"], arts["host"]], "v1.0.0", tmp_path / "dist", bench=[arts["bench"]])
    dist = tmp_path / "dist"
    assert sorted(p.name for p in dist.iterdir()) == [
        "RELEASE_NOTES.md", "SHA256SUMS", "convnet-1.0.0-host.tar.gz", "convnet-1.0.0-raspberry-pi-5.tar.gz"]
    assert [b.target for b in result.bundles] == ["host", "raspberry-pi/5"]
    # The release-level SHA256SUMS lists every archive and verifies with coreutils.
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=dist, capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout.count(": OK") == 2, check.stdout + check.stderr

    host = dist / "convnet-1.0.0-host.tar.gz"
    raw = host.read_bytes()
    assert raw[3] == 0 and raw[4:8] == b"\0\0\0\0"  # gzip: no FNAME flag, mtime 0
    top = "convnet-1.0.0-host"
    with tarfile.open(host, "r:gz") as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == [top] + [f"{top}/{n}" for n in (
            "MODEL_CARD.md", "RELEASE_NOTES.md", "SHA256SUMS", "bench.json", "latency.svg", "metadata.json",
            "model_library.so")]
        for m in members:
            assert (m.uid, m.gid, m.uname, m.gname, m.mtime) == (0, 0, "root", "root", epoch)
            assert m.mode == (0o755 if m.isdir() else 0o644)
        tar.extractall(tmp_path / "x", filter="data")
    bundle = tmp_path / "x" / top
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=bundle, capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout.count(": OK") == 6, check.stdout + check.stderr
    # The shipped library is byte-identical to the compiled one, and metadata.json vouches for it.
    assert _sha(bundle / "model_library.so") == _sha(arts["host"] / "model_library.so")
    assert json.loads((bundle / "metadata.json").read_text())["library"]["sha256"] == _sha(bundle / "model_library.so")

    card = (bundle / "MODEL_CARD.md").read_text()
    bench = json.loads(arts["bench"].read_text())
    assert card.startswith("# convnet 1.0.0 — host\n")
    assert "| input | 2x3x16x16 | float32 |" in card and "| probs | 2x10 | float32 |" in card
    # Latency numbers are the bench JSON's, not invented.
    assert f"| forgekit | 3 | {bench['forgekit']['median_ms']:.3f} |" in card
    assert f"| onnxruntime | 3 | {bench['onnxruntime']['median_ms']:.3f} |" in card
    # ... and so is the chart: one bar per runtime, as long as its median, labelled with it.
    assert "![latency: median per runtime](latency.svg)" in card
    svg = ET.parse(bundle / "latency.svg").getroot()
    bars = [float(r.get("width")) for r in svg.iter("{http://www.w3.org/2000/svg}rect")]
    fk, ort_ = bench["forgekit"]["median_ms"], bench["onnxruntime"]["median_ms"]
    # widths have 0.1 px steps: compare each with the longest bar (the slower runtime's, drawn full width), not
    # one rounded bar with another, whose rounding a ratio would magnify past 0.1 px
    assert len(bars) == 2
    for width, median in zip(bars, (fk, ort_)):
        assert width == pytest.approx(max(bars) * median / max(fk, ort_), abs=0.1)
    texts = "".join(t.text or "" for t in svg.iter("{http://www.w3.org/2000/svg}text"))
    assert f"{fk:.3g} ms" in texts and f"{ort_:.3g} ms" in texts
    assert f"`{_sha(bundle / 'model_library.so')}`" in card
    assert "The library is not encrypted." in card
    assert (bundle / "RELEASE_NOTES.md").read_text() == (dist / "RELEASE_NOTES.md").read_text()

    with tarfile.open(dist / "convnet-1.0.0-raspberry-pi-5.tar.gz", "r:gz") as tar:
        names = tar.getnames()
        arm_card = tar.extractfile("convnet-1.0.0-raspberry-pi-5/MODEL_CARD.md").read().decode()
        arm_lib = tar.extractfile("convnet-1.0.0-raspberry-pi-5/model_library.so").read()
    assert "convnet-1.0.0-raspberry-pi-5/bench.json" not in names
    assert "convnet-1.0.0-raspberry-pi-5/latency.svg" not in names  # no bench, no chart
    assert "Latency: not measured." in arm_card and "aarch64-linux-gnu" in arm_card
    assert arm_lib[:4] == b"\x7fELF" and arm_lib[18] == 183  # e_machine EM_AARCH64: really cross-linked
    notes = (dist / "RELEASE_NOTES.md").read_text()
    assert "| raspberry-pi/5 | `convnet-1.0.0-raspberry-pi-5.tar.gz` | float32 | no | not measured |" in notes
    assert f"| host | `convnet-1.0.0-host.tar.gz` | float32 | no | {bench['forgekit']['median_ms']:.3f} ms |" in notes


def test_publishing_is_bit_reproducible(arts, tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)  # falls back to the artifacts' creation time
    first = pub.publish([arts["host"], arts["rpi5"]], "1.0.0", tmp_path / "a" / "dist")
    second = pub.publish([arts["rpi5"], arts["host"]], "1.0.0", tmp_path / "elsewhere" / "deeper" / "out")
    assert [b.sha256 for b in first.bundles] == [b.sha256 for b in second.bundles]
    assert (first.sha256sums.read_bytes() == second.sha256sums.read_bytes())
    again = pub.publish([arts["host"], arts["rpi5"]], "1.0.0", tmp_path / "a" / "dist", force=True)
    assert [b.sha256 for b in again.bundles] == [b.sha256 for b in first.bundles]
    print("reproducible sha256:", {b.archive.name: b.sha256 for b in first.bundles})
    # The date is an input: another SOURCE_DATE_EPOCH gives other bytes (so it really is what pins them).
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)
    dated = pub.publish([arts["host"]], "1.0.0", tmp_path / "dated")
    assert dated.bundles[0].sha256 != first.bundles[0].sha256


def test_encrypted_bundle_key_only_on_request(arts, epoch, tmp_path) -> None:
    plain = pub.publish([arts["encrypted"]], "2.0.0-rc.1", tmp_path / "nokey")
    assert "modelKey.bin" not in plain.bundles[0].members
    assert plain.notes == ["host: encrypted; modelKey.bin not included (pass --include-key to ship it)."]
    with tarfile.open(plain.bundles[0].archive, "r:gz") as tar:
        card = tar.extractfile("convnet-2.0.0-rc.1-host/MODEL_CARD.md").read().decode()
    assert "is not in this bundle and is distributed separately" in card

    keyed = pub.publish([arts["encrypted"], arts["rpi5"]], "2.0.0-rc.1", tmp_path / "key", include_key=True)
    assert keyed.notes == ["raspberry-pi/5: not encrypted; no key file to include."]
    host = next(b for b in keyed.bundles if b.target == "host")
    with tarfile.open(host.archive, "r:gz") as tar:
        key = tar.getmember("convnet-2.0.0-rc.1-host/modelKey.bin")
        sums = tar.extractfile("convnet-2.0.0-rc.1-host/SHA256SUMS").read().decode()
        card = tar.extractfile("convnet-2.0.0-rc.1-host/MODEL_CARD.md").read().decode()
    assert key.mode == 0o600  # a secret stays owner-only when extracted
    assert f"{_sha(arts['encrypted'] / 'modelKey.bin')}  modelKey.bin\n" in sums
    assert "its key file `modelKey.bin` is in this bundle" in card


def test_failed_publish_leaves_no_output(arts, tmp_path, monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(pub, "write_reproducible_tar_gz", broken)
    with pytest.raises(OSError):
        pub.publish([arts["host"]], "1.0.0", tmp_path / "dist")
    assert list(tmp_path.iterdir()) == []  # neither DIST nor a temporary sibling


def test_library_api_errors(arts, tmp_path) -> None:
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / "old").write_text("x")
    with pytest.raises(OutputExistsError):
        pub.publish([arts["host"]], "1.0.0", tmp_path / "dist")
    with pytest.raises(OutputExistsError, match="holds the input"):  # the output gate: never over an input
        pub.publish([arts["host"]], "1.0.0", arts["host"].parent, force=True)
    tampered = tmp_path / "tampered"
    shutil.copytree(arts["host"], tampered)
    with open(tampered / "model_library.so", "ab") as handle:
        handle.write(b"\0")
    with pytest.raises(ArtifactError, match="does not match the sha256"):
        pub.publish([tampered], "1.0.0", tmp_path / "t")


def _one_line_error(proc: subprocess.CompletedProcess, code: int, fragment: str) -> None:
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], proc.stderr


def test_cli_publish_and_errors(arts, tmp_path) -> None:
    env = {"SOURCE_DATE_EPOCH": EPOCH}
    dist = tmp_path / "dist"
    ok = run_cli("publish", str(arts["host"]), "--version", "1.0.0", "-o", str(dist), "--bench", str(arts["bench"]),
                 "--json", str(tmp_path / "p.json"), env=env)
    assert ok.returncode == 0, ok.stderr
    report = json.loads((tmp_path / "p.json").read_text())
    archive = dist / "convnet-1.0.0-host.tar.gz"
    assert report["bundles"][0]["archive"] == str(archive) and report["bundles"][0]["sha256"] == _sha(archive)
    assert f"{archive}  sha256 {_sha(archive)}  (host, latency measured)" in ok.stdout

    args = ["--version", "1.0.0", "-o", str(tmp_path / "new")]
    _one_line_error(run_cli("publish", str(tmp_path), *args, env=env), 7, "is not a forgekit artifact directory")
    _one_line_error(run_cli("publish", str(arts["host"]), "--version", "1.0", "-o", str(tmp_path / "new"), env=env),
                    2, "is not semver-like")
    _one_line_error(run_cli("publish", str(arts["host"]), "--version", "1.0.0", "-o", str(dist), env=env),
                    8, "already exists")
    _one_line_error(run_cli("publish", str(arts["host"]), str(arts["encrypted"]), *args, env=env),
                    2, "Two artifacts for target 'host'")
    _one_line_error(run_cli("publish", str(arts["host"]), "--include-key", *args, env=env), 2, "none of the artifacts is encrypted")
    _one_line_error(run_cli("publish", str(arts["rpi5"]), "--bench", str(arts["bench"]), *args, env=env),
                    2, "measured target 'host'")
    _one_line_error(run_cli("publish", str(arts["host"]), "--bench", str(tmp_path / "p.json"), *args, env=env),
                    2, "is not a 'forgekit bench --json' result")
    assert not (tmp_path / "new").exists()
    # A second CLI publish of the same inputs gives the same archive bytes.
    again = run_cli("publish", str(arts["host"]), "--version", "1.0.0", "-o", str(tmp_path / "again"),
                    "--bench", str(arts["bench"]), env=env)
    assert again.returncode == 0 and _sha(tmp_path / "again" / archive.name) == _sha(archive)
    assert gzip.decompress(archive.read_bytes())[:len("convnet-1.0.0-host/")] == b"convnet-1.0.0-host/"


def test_with_runtime_notes_targets_that_install_the_wheel(arts, epoch, tmp_path) -> None:
    """--with-runtime on an x86-64 artifact ships no binaries (the forgekit-runtime wheel serves it) and says
    so instead of silently leaving runtime/ out."""
    result = pub.publish([arts["host"]], "1.0.0", tmp_path / "dist", with_runtime=True)
    assert result.notes == ["host: no cross-built runtime for this target (its card names the forgekit-runtime wheel)"]
    with tarfile.open(result.bundles[0].archive, "r:gz") as tar:
        assert not [m.name for m in tar.getmembers() if "/runtime/" in m.name]
        card = tar.extractfile("convnet-1.0.0-host/MODEL_CARD.md").read().decode()
    assert "pip install forgekit-runtime" in card and "On the device, without Python" not in card
