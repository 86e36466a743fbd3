"""compile(): every Forge option, atomic output, metadata (forgekit/compiler.py, pipeline.py)."""

from __future__ import annotations

import json
import uuid as uuidlib

import numpy as np
import onnx
import pytest

import forgekit as forge
from conftest import assert_close, ort_run
from forgekit.errors import CompileError, NotAvailableError, OutputExistsError, ToolchainError, UsageError
from forgekit.runtime import Engine


@pytest.fixture(scope="module")
def ir(convnet_path):
    return forge.from_onnx(convnet_path, {"input": [2, 3, 16, 16]})


@pytest.fixture(scope="module")
def expected(convnet_path, convnet_input):
    return ort_run(onnx.load(convnet_path), {"input": convnet_input})[0]


@pytest.mark.parametrize("opt_level", [0, 1, 2, 3, 4])
def test_every_opt_level_matches_onnxruntime(ir, opt_level, tmp_path, convnet_input, expected) -> None:
    result = ir.compile(target="host", output_path=tmp_path / "out", opt_level=opt_level, export_metadata=True)
    assert_close(Engine(result.path).infer(convnet_input)[0], expected)
    report = json.loads((result.path / "compile_report.json").read_text())
    assert report["operators"]["nn.conv2d"] == 1 and "graph_passes" in report["seconds"]
    # Levels differ in the passes they run: that is what makes them measurable.
    assert ("FoldConstant" in report["passes"]) == (opt_level >= 1)
    assert ("CombineParallelMatmul" in report["passes"]) == (opt_level >= 3)
    assert result.metadata["build"]["target"].get("fast-math") is None


@pytest.mark.parametrize("opt_level", [3, 4])
def test_level_4_fast_math_is_reassociation_and_contraction_only(opt_level) -> None:
    """All of LLVM's "fast-math" (no-NaN/no-inf assumptions, approximate reciprocals and functions included)
    moved a YOLOv8n detector's (NudeNet 320n, bench/pypi_corpus) head outputs by 1e-2 and its boxes by 0.1 px
    at level 4, which promises last-bit differences; with these three flags, 1.2e-4 px (level 3: 1.9e-4)."""
    from forgekit.build import tvm_target_for
    from forgekit.targets import parse_target

    target = tvm_target_for(parse_target("x86-64"), opt_level)
    flags = {k for k in ("fast-math", "fast-math-nnan", "fast-math-ninf", "fast-math-arcp", "fast-math-reassoc",
                         "fast-math-contract", "fast-math-nsz") if target.attrs.get(k)}
    assert flags == ({"fast-math-reassoc", "fast-math-contract", "fast-math-nsz"} if opt_level >= 4 else set())


def test_bad_opt_level(ir, tmp_path) -> None:
    with pytest.raises(UsageError, match="opt_level"):
        ir.compile(output_path=tmp_path / "x", opt_level=7)
    assert not (tmp_path / "x").exists()


def test_float16(ir, tmp_path, convnet_input, expected) -> None:
    result = ir.compile(target="host", output_path=tmp_path / "fp16", set_float16=True)
    assert result.metadata["model"]["precision"] == "float16"
    assert_close(Engine(result.path).infer(convnet_input)[0], expected, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(("layout", "recorded"), [("last", "NHWC"), ("NHWC", "NHWC"), ("first", "NCHW"), ("NCHW", "NCHW")])
def test_channel_layout(ir, tmp_path, convnet_input, expected, layout, recorded) -> None:
    result = ir.compile(target="host", output_path=tmp_path / "l", set_channel_layout=layout, export_relay=True)
    assert result.metadata["model"]["layout"] == recorded
    assert_close(Engine(result.path).infer(convnet_input)[0], expected)


def test_bad_layout(ir, tmp_path) -> None:
    with pytest.raises(UsageError, match="layout"):
        ir.compile(output_path=tmp_path / "x", set_channel_layout="diagonal")


def test_exports_and_uuid(ir, tmp_path) -> None:
    fixed = str(uuidlib.uuid4())
    result = ir.compile(target="host", output_path=tmp_path / "a", export_relay=True, export_metadata=True, uuid=fixed)
    names = sorted(p.name for p in result.path.iterdir())
    assert names == ["compile_report.json", "metadata.json", "model.relax.py", "model_library.so"]
    assert "R.nn.conv2d" in (result.path / "model.relax.py").read_text()
    assert result.metadata["uuid"] == fixed
    plain = ir.compile(target="host", output_path=tmp_path / "b")
    assert sorted(p.name for p in plain.path.iterdir()) == ["metadata.json", "model_library.so"]
    uuidlib.UUID(plain.metadata["uuid"])  # random uuid4 when none given
    with pytest.raises(UsageError, match="UUID"):
        ir.compile(target="host", output_path=tmp_path / "c", uuid="not-a-uuid")


def test_metadata_contents(ir, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    result = ir.compile(target="x86/avx2", output_path=tmp_path / "m")
    meta = result.metadata
    assert meta["created"] == "2023-11-14T22:13:20Z"
    assert meta["library"]["size"] == result.library.stat().st_size and len(meta["library"]["sha256"]) == 64
    assert meta["model"]["inputs"] == [{"name": "input", "shape": [2, 3, 16, 16], "dtype": "float32"}]
    assert meta["model"]["outputs"] == [{"name": "probs", "shape": [2, 10], "dtype": "float32"}]
    assert meta["model"]["fingerprint"] == ir.fingerprint and meta["model"]["hash"] == f"{ir.structural_hash():016x}"
    assert meta["build"]["target"] == {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell"}
    assert meta["build"]["target_name"] == "x86/avx2" and meta["build"]["family"] == "x86"
    assert set(meta["versions"]) == {"forgekit", "tvm", "tvm_ffi", "onnx"}
    assert meta["versions"]["tvm"].startswith("0.27") and meta["versions"]["tvm_ffi"] == "0.1.14.post0"


def test_existing_output_needs_force(ir, tmp_path) -> None:
    """An existing artifact is replaced only with force_overwrite; a folder that is not one, never."""
    out = tmp_path / "exists"
    ir.compile(target="host", output_path=out)
    first = (out / "metadata.json").read_text()
    with pytest.raises(OutputExistsError, match="--force") as info:
        ir.compile(target="host", output_path=out)
    assert isinstance(info.value, ValueError)  # Forge documents ValueError
    assert (out / "metadata.json").read_text() == first
    ir.compile(target="host", output_path=out, force_overwrite=True)
    assert (out / "metadata.json").read_text() != first and (out / "model_library.so").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["exists"]  # no temp dirs left
    other = tmp_path / "mine"
    other.mkdir()
    (other / "keep.txt").write_text("precious")
    with pytest.raises(OutputExistsError, match="not a forgekit artifact"):
        ir.compile(target="host", output_path=other, force_overwrite=True)
    assert [p.name for p in other.iterdir()] == ["keep.txt"] and (other / "keep.txt").read_text() == "precious"


def test_empty_existing_directory_is_fine(ir, tmp_path) -> None:
    (tmp_path / "empty").mkdir()
    ir.compile(target="host", output_path=tmp_path / "empty")


def test_failed_link_leaves_nothing(ir, tmp_path, monkeypatch) -> None:
    import tvm

    def explode(*args, **kwargs):
        raise RuntimeError("Compilation error:\n/usr/bin/ld: error: linker exploded\ncollect2: ld returned 1")

    monkeypatch.setattr(tvm.runtime.Executable, "export_library", explode)
    with pytest.raises(CompileError, match="failed: /usr/bin/ld: error: linker exploded"):
        ir.compile(target="host", output_path=tmp_path / "never")
    assert list(tmp_path.iterdir()) == []


def test_unknown_cross_triple_needs_a_toolchain(ir, tmp_path) -> None:
    with pytest.raises(ToolchainError, match="no linker known|knows no linker"):
        ir.compile(target={"kind": "llvm", "mtriple": "sparc-unknown-linux-gnu"}, output_path=tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_encrypted_compile_round_trip(ir, tmp_path, convnet_input, expected) -> None:
    from forgekit import crypto
    from forgekit.artifact.layout import file_digest

    result = ir.compile(target="host", output_path=tmp_path / "enc", encrypt_password="correct horse")
    assert sorted(p.name for p in result.path.iterdir()) == ["metadata.json", "modelKey.bin", "model_library.so"]
    assert crypto.is_encrypted(result.library) and result.metadata["library"]["encrypted"] is True
    assert result.metadata["library"]["sha256"] == file_digest(result.library)[0]  # covers the encrypted file
    assert crypto.read_header(result.library)["fingerprint"] == ir.fingerprint
    plain = Engine(ir.compile(target="host", output_path=tmp_path / "plain").path).infer(convnet_input)[0]
    np.testing.assert_array_equal(Engine(result.path, password="correct horse").infer(convnet_input)[0], plain)
    with pytest.raises(crypto.WrongPasswordError):
        Engine(result.path, password="wrong")
    with pytest.raises(crypto.KeyRequiredError, match="no key provided"):
        Engine(result.library.rename(tmp_path / "alone.so"), password="correct horse")
    with pytest.raises(crypto.EmptyPasswordError):
        ir.compile(output_path=tmp_path / "empty", encrypt_password="")
    assert not (tmp_path / "empty").exists()


def test_default_target_is_portable_and_so_is_llvm(ir, tmp_path, convnet_input, expected) -> None:
    """One default everywhere (forgekit.options.DEFAULT_TARGET): the portable x86-64 target, whose baseline
    needs SSE4.2 and whose best level this CPU loads; Forge's ``target="llvm"`` means the same."""
    default = ir.compile(output_path=tmp_path / "default")
    assert default.metadata["build"]["target_name"] == "x86-64" and "sse4.2" in default.metadata["build"]["cpu_features"]
    assert_close(Engine(default.path).infer(convnet_input)[0], expected)
    result = ir.compile(target="llvm", output_path=tmp_path / "generic")
    assert result.metadata["build"]["target"] == {"kind": "llvm", "mcpu": "x86-64-v2", "mtriple": "x86_64-linux-gnu"}
    assert result.metadata["build"]["levels"] == ["x86-64-v4", "x86-64-v3", "x86-64-v2"]
    assert_close(Engine(result.path).infer(convnet_input)[0], expected)
    assert np.isfinite(Engine(result.path).infer(convnet_input)[0]).all()
