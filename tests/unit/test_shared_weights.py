"""forgekit/backends/cpu/shared_weights.py (and tiling.layout_tile): the levels of a portable x86-64 artifact pack
their weights alike and store them once, in a file each level maps; a missing or foreign file is one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

import forgekit
from conftest import assert_close, ort_run, run_cli
from onnx_models import levels_model
from forgekit.errors import ArtifactError, UsageError
from forgekit.runtime import Engine, compat
from forgekit.runtime.cpu import host_arch, host_features

pytestmark = pytest.mark.skipif(host_arch() != "x86_64", reason="portable x86-64 artifacts run on x86-64 only")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("shared") / "levels.onnx"
    onnx.save(levels_model(), path)
    return path


@pytest.fixture(scope="module")
def artifact(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return forgekit.from_onnx(model_path).compile(target="x86-64", output_path=tmp_path_factory.mktemp("a") / "p").path


def _copy(artifact: Path, to: Path) -> Path:
    import shutil

    return Path(shutil.copytree(artifact, to))


def test_the_levels_pack_the_same_bytes() -> None:
    """v3 and v2 pack every array as v4 does (layout_tile), so all of them are shared; a single-ISA AVX2 target
    keeps its own tiles."""
    import tvm

    from forgekit.backends.cpu import shared_weights
    from forgekit.backends.cpu.tiling import choose_tiles, layout_tile
    from forgekit.build import build_executables
    from forgekit.targets import parse_target
    from forgekit.targets.isa import isa_info
    from forgekit.targets.variants import model_variants

    levels = [v.spec for v in model_variants(parse_target("x86-64"), None, [])]
    mod = forgekit.from_onnx(levels_model()).mod
    built = build_executables(mod, levels, external_weights=True)
    stores = [b.weights for b in built]
    assert len(stores) == 3 and all(s is not None and len(s.arrays) >= 4 for s in stores)
    shared = shared_weights.build(stores)
    assert shared is not None and all(shared.offset_of(a) is not None for s in stores for a in s.arrays)
    v4, v3 = (isa_info(tvm.target.Target({"kind": "llvm", "mcpu": c})) for c in ("x86-64-v4", "x86-64-v3"))
    haswell = isa_info(tvm.target.Target({"kind": "llvm", "mcpu": "haswell"}))
    assert v3.shared_layout and not haswell.shared_layout and not v4.shared_layout
    for ev, er in ((64, 14), (256, 3), (48, 7), (1024, 49)):
        assert layout_tile(ev, er, v3) == layout_tile(ev, er, v4) == choose_tiles(ev, er, v4)[0]
        assert layout_tile(ev, er, haswell) == choose_tiles(ev, er, haswell)[0]
        assert choose_tiles(ev, er, v3)[0] // v3.vec_lanes <= 4  # at most 4 AVX2 registers per row
    for ev in (1, 3, 4, 6, 12):  # fewer channels than AVX-512 lanes (an RGB or a 1-class head): their own tiles
        assert layout_tile(ev, 8, v3) == choose_tiles(ev, 8, v3)[0] == choose_tiles(ev, 8, haswell)[0]


def _ragged_model() -> onnx.ModelProto:
    """x[1, 64, 8, 8] -> 1x1 conv to 200 channels -> mean -> MatMul to 1000 classes: column counts that are
    whole AVX2 vectors but not whole AVX-512 ones (v4 computes 208 and 1008)."""
    rng = np.random.default_rng(3)
    h = onnx.helper
    nodes = [h.make_node("Conv", ["x", "w"], ["c"]), h.make_node("Relu", ["c"], ["r"]),
             h.make_node("GlobalAveragePool", ["r"], ["g"]), h.make_node("Flatten", ["g"], ["f"]),
             h.make_node("MatMul", ["f", "m"], ["y"])]
    inits = [onnx.numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)
             for name, shape in (("w", (200, 64, 1, 1)), ("m", (200, 1000)))]
    graph = h.make_graph(nodes, "ragged", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64, 8, 8])],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 1000])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def test_columns_past_whole_vectors_share_one_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A conv or matmul whose output channels are not whole AVX-512 vectors (1000 classes, ddddocr's 8210) was
    padded to each level's own vectors (1008, 1000, 1000), so every level packed and stored its own copy: 127 MB
    for ddddocr's 54 MB.  v3 and v2 now pad as v4 does where that adds at most 1/16 (tiling.padded_columns)."""
    import tvm

    from forgekit.backends.cpu.tiling import padded_columns
    from forgekit.targets.isa import isa_info

    v4, v3, v2, haswell = (isa_info(tvm.target.Target({"kind": "llvm", "mcpu": c}))
                           for c in ("x86-64-v4", "x86-64-v3", "x86-64-v2", "haswell"))
    for n, wide in ((1000, 1008), (8210, 8224), (200, 208), (48, 48)):
        assert padded_columns(n, v4) == padded_columns(n, v3) == padded_columns(n, v2) == wide
    assert (padded_columns(8210, haswell), padded_columns(1000, haswell)) == (8216, 1000)  # one level: its own
    assert padded_columns(24, v3) == 24 and padded_columns(24, v4) == 32  # 1/3 more columns: not worth it
    model = _ragged_model()
    out = forgekit.from_onnx(model).compile(target="x86-64", output_path=tmp_path / "a").path
    meta = json.loads((out / "metadata.json").read_text())
    # 851 KB of weights: all in the shared file, none left in a level's library
    assert meta["library"]["weights"]["size"] > 800_000
    assert all(v["size"] < 200_000 for v in meta["library"]["variants"]), meta["library"]["variants"]
    x = np.random.default_rng(4).random((1, 64, 8, 8), dtype=np.float32)
    expected = ort_run(model, {"x": x})[0]
    for level in [v["name"] for v in meta["library"]["variants"] if set(v["cpu_features"]) <= host_features()]:
        monkeypatch.setenv(compat.LEVEL_ENV, level)
        assert_close(Engine(out).infer(x)[0], expected)


@pytest.mark.parametrize("oc", [1, 4, 12])
def test_convs_with_fewer_channels_than_lanes_compile_for_every_level(oc: int, tmp_path: Path) -> None:
    """A 16 -> oc 1x1 conv (a depth or mask head, an RGB output): the v3/v2 tiles divided by zero (red-team,
    ``integer division or modulo by zero`` from every super-resolution and 1-class segmentation model)."""
    rng = np.random.default_rng(oc)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Conv", ["x", "w"], ["y"])], "head",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16, 8, 8])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, oc, 8, 8])],
        [onnx.numpy_helper.from_array(rng.standard_normal((oc, 16, 1, 1)).astype(np.float32), "w")])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    out = forgekit.from_onnx(model).compile(target="x86-64", output_path=tmp_path / "a").path
    x = rng.random((1, 16, 8, 8), dtype=np.float32)
    assert_close(Engine(out).infer(x)[0], ort_run(model, {"x": x})[0])


def test_one_weights_file_serves_every_level(artifact: Path, model_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from forgekit.artifact.layout import file_digest, library_files

    meta = json.loads((artifact / "metadata.json").read_text())
    weights = meta["library"]["weights"]
    assert weights["file"].startswith("model_weights.") and weights["file"] in library_files(meta)
    assert file_digest(artifact / weights["file"]) == (weights["sha256"], weights["size"])
    # the file holds the weights, the levels' libraries their code: each level is smaller than the file
    assert all(v["size"] < weights["size"] for v in meta["library"]["variants"][1:])
    x = np.random.default_rng(1).random((1, 8, 16, 16), dtype=np.float32)
    expected = ort_run(model_path, {"x": x})[0]
    runnable = [v["name"] for v in meta["library"]["variants"] if set(v["cpu_features"]) <= host_features()]
    assert len(runnable) >= 2
    for level in runnable:
        monkeypatch.setenv(compat.LEVEL_ENV, level)
        engine = Engine(artifact)
        assert engine.level == level
        assert_close(engine.infer(x)[0], expected)


def _section_names(library: Path) -> set[str]:
    """The section names of a little-endian ELF64 shared library (read here: no ELF package is a dependency)."""
    import struct

    data = library.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strings = headers[shstrndx][4]  # sh_offset of the section-name table
    return {data[strings + h[0]:data.index(b"\0", strings + h[0])].decode() for h in headers}


def test_libraries_carry_no_debug_sections(artifact: Path) -> None:
    """TVM's LLVM codegen emits DWARF for every kernel; the linker drops it (backends/link.LINK_FLAGS), and the
    symbol table stays for profilers."""
    libraries = sorted(artifact.glob("model_library*.so"))
    assert len(libraries) == 3
    for library in libraries:
        names = _section_names(library)
        assert ".text" in names and ".symtab" in names
        assert not {n for n in names if n.startswith(".debug")}, library.name


def test_a_missing_weights_file_is_one_line_before_loading(artifact: Path, tmp_path: Path) -> None:
    copy = _copy(artifact, tmp_path / "moved")
    name = json.loads((copy / "metadata.json").read_text())["library"]["weights"]["file"]
    (copy / name).unlink()
    with pytest.raises(ArtifactError, match=f"has no {name}: .*copy the whole artifact directory"):
        Engine(copy)
    proc = run_cli("run", str(copy), "--random")
    assert proc.returncode == 7 and "Traceback" not in proc.stderr and name in proc.stderr, proc.stderr


@pytest.mark.parametrize("damage", ["header", "size"])
def test_a_foreign_weights_file_is_refused_not_used(artifact: Path, tmp_path: Path, damage: str) -> None:
    """The library compares the file's header (digest of its arrays) with its own copy before serving a byte:
    another build's file of the same name is an error, never wrong weights; so is a truncated one."""
    copy = _copy(artifact, tmp_path / damage)
    name = json.loads((copy / "metadata.json").read_text())["library"]["weights"]["file"]
    data = bytearray((copy / name).read_bytes())
    if damage == "header":
        data[30] ^= 0xFF  # a byte of the digest
    else:
        data = data[:-64]
    (copy / name).write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=f"{name}' does not match the sha256"):  # the runtime's check first
        Engine(copy)
    meta = json.loads((copy / "metadata.json").read_text())  # without a recorded digest, the library's own check
    del meta["library"]["weights"]["sha256"]
    (copy / "metadata.json").write_text(json.dumps(meta))
    expected = "header mismatch" if damage == "header" else "wrong size"
    with pytest.raises(ArtifactError, match=f"Cannot load .*{expected}"):  # at load, not at the first inference
        Engine(copy)
    proc = run_cli("run", str(copy), "--random")
    assert proc.returncode == 7 and "Traceback" not in proc.stderr and expected in proc.stderr, proc.stderr


def test_encrypting_in_place_is_refused_and_encrypted_builds_embed(artifact: Path, model_path: Path,
                                                                   tmp_path: Path) -> None:
    from forgekit.artifact.encryption import encrypt_artifact

    copy = _copy(artifact, tmp_path / "plain")
    before = {p.name: p.read_bytes() for p in copy.iterdir()}
    with pytest.raises(UsageError, match="compile it again with --encrypt"):
        encrypt_artifact(copy, "a-password-1")
    assert {p.name: p.read_bytes() for p in copy.iterdir()} == before
    enc = forgekit.from_onnx(model_path).compile(target="x86-64", output_path=tmp_path / "enc",
                                                 encrypt_password="a-password-1").path
    meta = json.loads((enc / "metadata.json").read_text())
    assert meta["library"]["weights"] is None and not list(enc.glob("model_weights.*"))
    x = np.random.default_rng(2).random((1, 8, 16, 16), dtype=np.float32)
    assert_close(Engine(enc, password="a-password-1").infer(x)[0], ort_run(model_path, {"x": x})[0])
