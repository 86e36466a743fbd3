"""Android artifacts: what Android's loader needs from the ELF (forgekit/targets/families/android*.py).

No Android device here: the tests link real libraries (Debian clang + lld, or the NDK when
ANDROID_NDK_HOME is set) and check the dynamic section, segments and symbols with readelf.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

import forgekit as forge

pytestmark = pytest.mark.skipif(
    shutil.which("readelf") is None or (shutil.which("clang") is None or shutil.which("ld.lld") is None),
    reason="needs clang and lld (./dev.sh test installs them)")


def readelf(*args: str) -> str:
    return subprocess.run(["readelf", "-W", *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def ir(convnet_path):
    return forge.from_onnx(convnet_path, {"input": [2, 3, 16, 16]})


@pytest.mark.parametrize(("target", "machine", "elf_class"),
                         [("android/cpu", "AArch64", "ELF64"), ("android/armeabi-v7a", "ARM", "ELF32")])
def test_android_library_dynamic_section(ir, tmp_path, target, machine, elf_class) -> None:
    lib = ir.compile(target=target, output_path=tmp_path / "a").library
    header = readelf("-h", str(lib))
    assert re.search(rf"Class:\s+{elf_class}", header) and re.search(rf"Machine:\s+{machine}", header)
    assert re.search(r"Type:\s+DYN", header)

    dynamic = readelf("-d", str(lib))
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dynamic)
    assert "libtvm_ffi.so" in needed  # TVMFFI* calls resolve through the library's own DT_NEEDED tree
    assert set(needed) <= {"libtvm_ffi.so", "libtvm_runtime.so", "libc.so", "libm.so"}, needed
    assert "Library soname: [model_library.so]" in dynamic
    assert "TEXTREL" not in dynamic  # Android 6+ refuses text relocations
    assert "BIND_NOW" in dynamic and "(GNU_HASH)" in dynamic and "(HASH)" in dynamic  # API 21-22 need SysV

    segments = readelf("-l", str(lib))
    loads = [line.split() for line in segments.splitlines() if line.strip().startswith("LOAD")]
    assert loads and all(fields[-1] == "0x4000" for fields in loads)  # 16 KB pages (Android 15)

    symbols = readelf("--dyn-syms", str(lib))
    exported = {f[7] for f in (line.split() for line in symbols.splitlines()) if len(f) >= 8 and f[6] != "UND"}
    assert "__tvm_ffi__library_bin" in exported  # the runtime's entry: the packed VM executable
    assert any(name.startswith("__tvm_ffi_fused_conv2d") for name in exported)
    undefined = {f[7] for f in (line.split() for line in symbols.splitlines())
                 if len(f) >= 8 and f[6] == "UND" and f[4] == "GLOBAL"}
    assert "TVMFFIErrorSetRaisedFromCStrParts" in undefined
    assert not any(name.startswith("__aeabi_unwind") for name in undefined)  # defined locally on armv7


def test_android_toolchain_metadata(ir, tmp_path) -> None:
    meta = ir.compile(target="android/cpu", output_path=tmp_path / "m").metadata["build"]
    assert meta["triple"] == "aarch64-linux-android" and meta["family"] == "android"
    assert meta["toolchain"]["android_api"] == "21" and meta["toolchain"]["page_size"] == "16384"
    assert meta["toolchain"]["linker_version"]
    assert meta["cpu"] == "cortex-a76" and "+dotprod" in meta["features"] and meta["gpu_arch"] is None
