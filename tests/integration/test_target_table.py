"""Every target of the README's target table builds with the toolchain the table names for it.

The README promises, per family, a toolchain (``g++``; Debian's GNU cross compilers; "the NDK, or clang +
lld"; nvcc): each tag the table lists is compiled here with exactly that toolchain, from a model whose
weights are lifted into the library (forgekit/backends/cpu/weights.py) and, for the portable x86-64 target,
shared between its levels (shared_weights.py), so every piece of C forgekit generates is compiled for every
family.  The tiny models of the other target tests have weights under the 4 KiB that are lifted, which is
how ``-t android/arm64-v8a`` with Debian's clang stopped linking unnoticed (its weights C included
``<stdint.h>``, which has no Android sysroot there: exit 6, "1 error generated.").
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import onnx
import pytest

import forgekit
from onnx_models import levels_model

README = Path(__file__).resolve().parents[2] / "README.md"
#: ELF e_machine of each architecture metadata.json records
ELF_MACHINE = {"x86_64": 62, "aarch64": 183, "arm": 40}
#: the tools each family's tags need here (a missing one skips, naming it; ./dev.sh test installs them all)
TOOLS = {"x86-64": ("g++",), "ARM Linux": ("aarch64-linux-gnu-g++", "arm-linux-gnueabihf-g++"),
         "Android": ("clang", "ld.lld"), "NVIDIA GPU": ()}


def target_table() -> list[tuple[str, str, str]]:
    """(family, tag, toolchain cell) for every tag of the README's target table (``a/3|4|5``: three tags)."""
    text = README.read_text()
    rows = text[text.index("| family | tags"):].split("\n\n", 1)[0].splitlines()[2:]
    out = []
    for row in rows:
        family, tags, toolchain, _ = (cell.strip() for cell in row.strip("|").split(" | "))
        for tag in re.findall(r"`([^`]+)`", tags):
            stem, _, alternatives = tag.replace("\\|", "|").partition("|")
            if alternatives:
                base = stem.rsplit("/", 1)[0]
                out += [(family, f"{base}/{alt}", toolchain) for alt in [stem.rsplit("/", 1)[1], *alternatives.split("|")]]
            else:
                out.append((family, tag, toolchain))
    return out


TABLE = target_table()


def test_the_table_is_read_whole() -> None:
    families = {family for family, _, _ in TABLE}
    assert families == set(TOOLS), families
    tags = {tag for _, tag, _ in TABLE}
    assert {"x86-64", "raspberry-pi/3", "raspberry-pi/5", "android/arm64-v8a", "cuda/sm_86", "jetson/orin"} <= tags


def _have_nvcc() -> bool:
    from forgekit.backends.cuda.nvcc import _wheel_nvcc

    return bool(os.environ.get("CUDA_HOME") or shutil.which("nvcc") or _wheel_nvcc())


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("table") / "levels.onnx"
    onnx.save(levels_model(), path)
    return path


@pytest.mark.parametrize(("family", "tag", "toolchain"), TABLE, ids=[tag for _, tag, _ in TABLE])
def test_every_tag_of_the_table_builds_with_the_toolchain_it_names(family, tag, toolchain, model_path, tmp_path,
                                                                   monkeypatch) -> None:
    missing = [tool for tool in TOOLS[family] if shutil.which(tool) is None]
    if missing or (family == "NVIDIA GPU" and not _have_nvcc()):
        pytest.skip(f"needs {', '.join(missing) or 'nvcc'} (./dev.sh test installs it)")
    if family == "Android":  # the table's "clang + lld": Debian's, without the NDK (tested below when set)
        for name in ("ANDROID_NDK_HOME", "ANDROID_NDK_ROOT"):
            monkeypatch.delenv(name, raising=False)
    result = forgekit.from_onnx(model_path).compile(target=tag, output_path=tmp_path / "out")
    build = json.loads((result.path / "metadata.json").read_text())["build"]
    tools = build["toolchain"]
    named = tools["nvcc"] if family == "NVIDIA GPU" else tools["linker"]
    assert os.path.basename(named) in toolchain.replace("`", ""), (tag, tools, toolchain)
    library = result.path / "model_library.so"
    data = library.read_bytes()
    assert int.from_bytes(data[18:20], "little") == ELF_MACHINE[build["arch"]], (tag, build["arch"])
    if family != "NVIDIA GPU":  # CPU builds serve their weights from generated C compiled into the library
        assert b"__tvm_ffi_forgekit_weight" in data, tag
    if tag == "x86-64":  # the levels share their weights: the shared-weights C is compiled too
        assert list(result.path.glob("model_weights.*.bin")), sorted(p.name for p in result.path.iterdir())


@pytest.mark.skipif(not (os.environ.get("ANDROID_NDK_HOME") or os.environ.get("ANDROID_NDK_ROOT")),
                    reason="the table's other Android toolchain, the NDK: set ANDROID_NDK_HOME to test it")
@pytest.mark.parametrize("tag", ["android/arm64-v8a", "android/armeabi-v7a"])
def test_android_builds_with_the_ndk(tag, model_path, tmp_path) -> None:
    result = forgekit.from_onnx(model_path).compile(target=tag, output_path=tmp_path / "ndk")
    linker = json.loads((result.path / "metadata.json").read_text())["build"]["toolchain"]["linker"]
    assert "ndk" in linker.lower() or "android" in linker.lower(), linker
    assert b"__tvm_ffi_forgekit_weight" in (result.path / "model_library.so").read_bytes()


@pytest.mark.skipif(shutil.which("clang") is None, reason="needs clang (./dev.sh test installs it)")
def test_a_failed_link_says_what_the_compiler_said_not_its_error_count(tmp_path) -> None:
    """The one line of a failed link is the compiler's diagnostic: the Android failure above said only
    "1 error generated.", clang's closing count, after the line naming the missing header."""
    import subprocess

    from forgekit.backends.link import link_error_line

    source = tmp_path / "hosted.c"
    source.write_text("#include <stdint.h>\nuint32_t f(void) { return 0; }\n")
    clang = subprocess.run(["clang", "--target=aarch64-linux-android21", "-c", str(source), "-o",
                            str(tmp_path / "hosted.o")], capture_output=True, text=True)
    if clang.returncode == 0:
        pytest.skip("this clang has an Android sysroot: nothing fails")
    assert clang.stderr.strip().endswith("1 error generated."), clang.stderr
    line = link_error_line(f"Compilation error:\n{clang.stderr}")
    assert "fatal error:" in line and "file not found" in line, line


#: each family's C compiler as forgekit drives it (GCC families compile the generated .c as C++)
FAMILY_COMPILERS = {"x86-64": ["g++"], "aarch64 Linux": ["aarch64-linux-gnu-g++"],
                    "armhf Linux": ["arm-linux-gnueabihf-g++"],
                    "Android arm64": ["clang", "--target=aarch64-linux-android21"],
                    "Android armv7": ["clang", "--target=armv7a-linux-androideabi21"]}


@pytest.mark.parametrize("family", sorted(FAMILY_COMPILERS))
def test_the_generated_c_compiles_freestanding_for_every_family(family, tmp_path) -> None:
    """All the C forgekit writes into a library (the weights' server with the shared-weights prelude, which
    maps a file) compiles with no C library headers: Debian's clang has none for Android (no NDK), and a
    portable target of any family may one day share its levels' weights.  -Wall -Wextra: nothing to say."""
    import subprocess

    import numpy as np
    import tvm_ffi

    from forgekit.backends.cpu import shared_weights
    from forgekit.backends.cpu.weights import SOURCE_FLAGS, WeightStore

    compiler = FAMILY_COMPILERS[family]
    if shutil.which(compiler[0]) is None:
        pytest.skip(f"needs {compiler[0]} (./dev.sh test installs it)")
    common, own = np.arange(2048, dtype=np.float32), np.ones(1500, dtype=np.float32)
    stores = [WeightStore(), WeightStore()]
    stores[0].arrays += [common, own]
    stores[1].arrays.append(common)
    shared = shared_weights.build(stores)
    assert shared is not None
    source = stores[0].sources(tmp_path, "aarch64", shared)[0]
    assert "fk_shared_fail" in Path(source).read_text()  # the prelude is in it
    include = Path(tvm_ffi.__file__).parent / "include"
    done = subprocess.run([*compiler, *SOURCE_FLAGS, "-Wall", "-Wextra", "-fPIC", f"-I{include}", "-c", source,
                           "-o", str(tmp_path / "weights.o")], capture_output=True, text=True)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
