"""The runtime cross-built for targets without a wheel (forgekit.deploy.cross, ``forgekit runtime build``).

aarch64 and armhf: the tiny convnet is compiled for a Raspberry Pi tag, the TVM runtime + C runtime +
forgekit-run are cross-built from the wheels' sources, copied into a *bare* Debian chroot (minbase: no
Python) and run under qemu user-mode emulation on an .npy input; the output is compared with onnxruntime
on the host.  Android: the runtime links for both ABIs with the NDK and passes the artifacts' ELF checks
(NEEDED, SONAME, 16 KB pages); nothing runs (no Android device here).  A first build of one runtime
takes minutes on 2 cores (then cached under ~/.cache/forgekit/runtime), a bare rootfs a few more.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import numpy as np
import onnx
import pytest

import forgekit
from forgekit.deploy.cross import LIBRARIES, PROGRAM, build_cross_runtime
from forgekit.deploy.cross_toolchains import toolchain_for
from forgekit.errors import TargetError

from conftest import ort_run, run_cli

TOL = 1e-4
GNU = {"aarch64": "aarch64-linux-gnu-g++", "arm": "arm-linux-gnueabihf-g++"}
QEMU = {"aarch64": "qemu-aarch64-static", "arm": "qemu-arm-static"}
HAS_NDK = bool(os.environ.get("ANDROID_NDK_HOME") or os.environ.get("ANDROID_NDK_ROOT"))


def _missing(arch: str) -> str | None:
    """Why the ``arch`` round trip cannot run here (None: it can)."""
    tools = [GNU[arch], QEMU[arch], "cmake", "debootstrap"]
    absent = [tool for tool in tools if shutil.which(tool) is None]
    if absent:
        return f"needs {', '.join(absent)} (./dev.sh test installs them)"
    return None if os.geteuid() == 0 else "needs root (debootstrap, chroot)"


def readelf(*args: str) -> str:
    return subprocess.run(["readelf", "-W", *args], capture_output=True, text=True, check=True).stdout


def needed(path: Path) -> list[str]:
    return re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", readelf("-d", str(path)))


@pytest.mark.slow
@pytest.mark.parametrize(("tag", "arch", "machine"), [("raspberry-pi/4", "aarch64", "AArch64"),
                                                      ("raspberry-pi/4-armhf", "arm", "ARM")])
def test_forgekit_run_in_bare_chroot_matches_onnxruntime(tag, arch, machine, convnet_path, convnet_input,
                                                         tmp_path) -> None:
    if _missing(arch):
        pytest.skip(_missing(arch))
    from forgekit.devices import rootfs

    artifact = tmp_path / "convnet"
    forgekit.from_onnx(convnet_path, {"input": [2, 3, 16, 16]}).compile(target=tag, output_path=artifact)
    build = build_cross_runtime(tag)
    assert [p.name for p in build.files] == [*LIBRARIES, PROGRAM]
    for path in build.files:
        assert re.search(rf"Machine:\s+{machine}", readelf("-h", str(path))), path
        assert not any("python" in name for name in needed(path)), path  # nothing of Python on the device
        if path.suffix == ".so":
            assert f"Library soname: [{path.name}]" in readelf("-d", str(path)), path
    # the libraries find each other next to forgekit-run: $ORIGIN, no absolute path of this machine
    assert "RUNPATH" in readelf("-d", str(build.program)) and "[$ORIGIN]" in readelf("-d", str(build.program))
    assert "libforgekit_runtime.so" in needed(build.program)
    assert {"libtvm_ffi.so", "libtvm_runtime.so"} <= set(needed(build.library("libforgekit_runtime.so")))

    root = rootfs.ensure_rootfs(arch, bare=True)
    assert not (root / "usr" / "bin" / "python3").exists()  # a device without Python
    guest_dir = Path("/opt") / f"forgekit-{uuid.uuid4().hex[:8]}"
    host_dir = root / guest_dir.relative_to("/")
    try:
        host_dir.mkdir(parents=True)
        for path in build.files:
            shutil.copy2(path, host_dir / path.name)
        shutil.copytree(artifact, host_dir / "model")
        np.save(host_dir / "in.npy", convnet_input)
        done = rootfs.run_in_rootfs(root, rootfs.guest(arch, bare=True),
                                    [str(guest_dir / PROGRAM), str(guest_dir / "model"), "-i",
                                     str(guest_dir / "in.npy"), "-o", str(guest_dir / "out")], timeout=600)
        assert done.returncode == 0, done.stderr
        assert "probs: 2x10 float32" in done.stdout
        got = np.load(host_dir / "out" / "probs.npy")
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)
    expected = ort_run(onnx.load(convnet_path), {"input": convnet_input})[0]
    assert got.dtype == np.float32 and got.shape == (2, 10)
    np.testing.assert_allclose(got, expected, rtol=TOL, atol=TOL)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_NDK, reason="the Android runtime is C++: it needs the NDK's Bionic headers and libc++ "
                    "(set ANDROID_NDK_HOME); Debian packages neither")
@pytest.mark.parametrize(("tag", "machine"), [("android/arm64-v8a", "AArch64"), ("android/armeabi-v7a", "ARM")])
def test_android_runtime_links_with_the_artifacts_elf_properties(tag, machine) -> None:
    build = build_cross_runtime(tag)
    for path in build.files:
        assert re.search(rf"Machine:\s+{machine}", readelf("-h", str(path))), path
        dynamic = readelf("-d", str(path))
        assert "TEXTREL" not in dynamic and "BIND_NOW" in dynamic
        loads = [line.split() for line in readelf("-l", str(path)).splitlines() if line.strip().startswith("LOAD")]
        assert loads and all(fields[-1] == "0x4000" for fields in loads), path  # 16 KB pages (Android 15)
        if path.name.endswith(".so") and path.name != "libc++_shared.so":
            assert f"Library soname: [{path.name}]" in dynamic
            assert set(needed(path)) <= {*LIBRARIES, "libc++_shared.so", "libc.so", "libm.so", "libdl.so",
                                         "liblog.so"}, needed(path)
    assert "libforgekit_runtime.so" in needed(build.program)


def test_the_support_headers_the_wheel_lacks_are_vendored() -> None:
    """Without a TVM checkout the build takes include/tvm/support, src/support and compiler-rt's fp16 header
    from runtime/cross/tvm_support (CI cannot reach GitHub)."""
    from forgekit.deploy.cross import VENDORED, tvm_source_dir

    if os.environ.get("FORGEKIT_TVM_SOURCE"):
        pytest.skip("FORGEKIT_TVM_SOURCE overrides the vendored headers")
    assert tvm_source_dir() == VENDORED
    for header in ("include/tvm/support/io.h", "include/tvm/support/serializer.h", "src/support/utils.h",
                   "3rdparty/compiler-rt/builtin_fp16.h"):
        assert (VENDORED / header).is_file(), header


@pytest.mark.parametrize(("tag", "abi"), [("raspberry-pi/4-armhf", "arm-linux-gnueabihf"),
                                         ("raspberry-pi/3-armhf", "arm-linux-gnueabihf"),
                                         ("raspberry-pi/5", "aarch64-linux-gnu"), ("arm/aarch64", "aarch64-linux-gnu"),
                                         ("jetson/nano-cpu", "aarch64-linux-gnu")])
def test_tags_pick_their_familys_cross_compiler(tag, abi) -> None:
    toolchain = toolchain_for(tag)
    assert toolchain.name == abi and toolchain.cxx == f"{abi}-g++" and toolchain.ship == ()
    text = toolchain.cmake_file()
    assert f'set(CMAKE_CXX_COMPILER "{abi}-g++")' in text and "set(CMAKE_SYSTEM_NAME Linux)" in text
    assert 'set(FORGEKIT_LINK_FLAGS "-s")' in text  # stripped: the runtime goes onto small devices
    with pytest.raises(TargetError, match="No cross runtime for 'x86/avx2'"):
        toolchain_for("x86/avx2")


def test_cli_refuses_targets_without_a_cross_runtime(tmp_path) -> None:
    done = run_cli("runtime", "build", "--target", "cuda/sm_86", "-o", str(tmp_path / "rt"))
    assert done.returncode == 5 and done.stderr.count("\n") == 1, done.stderr
    assert "not a CPU target" in done.stderr
    if not HAS_NDK:  # the toolchain is named before anything is built
        done = run_cli("runtime", "build", "--target", "android/arm64-v8a", "-o", str(tmp_path / "rt"),
                       env={"ANDROID_NDK_HOME": "", "ANDROID_NDK_ROOT": ""})
        assert done.returncode == 10 and "ANDROID_NDK_HOME" in done.stderr and done.stderr.count("\n") == 1
    done = run_cli("runtime", "build", "--target", "raspberry-pi/4-armhf", "-o", str(tmp_path / "rt"),
                   "--tvm-source", str(tmp_path))
    assert done.returncode == 10 and "is not a TVM source tree" in done.stderr and done.stderr.count("\n") == 1
    assert not (tmp_path / "rt").exists()


@pytest.mark.slow
def test_cli_copies_the_cached_build(tmp_path) -> None:
    if _missing("aarch64"):
        pytest.skip(_missing("aarch64"))
    done = run_cli("runtime", "build", "--target", "raspberry-pi/4", "-o", str(tmp_path / "rt"))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "rt").iterdir()) == sorted([*LIBRARIES, PROGRAM])
    assert os.access(tmp_path / "rt" / PROGRAM, os.X_OK)


@pytest.mark.slow
def test_published_armhf_bundle_runs_on_the_device_as_its_card_says(convnet_path, convnet_input, tmp_path) -> None:
    """publish --with-runtime: the raspberry-pi/4-armhf bundle carries runtime/ (libraries, forgekit-run, the
    C API headers); unpacked in a bare armhf chroot, the card's forgekit-run command runs it under qemu-arm."""
    if _missing("arm"):
        pytest.skip(_missing("arm"))
    import tarfile

    from forgekit.devices import rootfs

    artifact = tmp_path / "convnet"
    forgekit.from_onnx(convnet_path, {"input": [2, 3, 16, 16]}).compile(target="raspberry-pi/4-armhf",
                                                                       output_path=artifact)
    done = run_cli("publish", str(artifact), "--version", "1.0.0", "-o", str(tmp_path / "dist"), "--with-runtime")
    assert done.returncode == 0, done.stderr
    (archive,) = (tmp_path / "dist").glob("*.tar.gz")
    top = archive.name[:-len(".tar.gz")]
    with tarfile.open(archive) as tar:
        modes = {m.name: m.mode for m in tar.getmembers() if m.isfile()}
        card = tar.extractfile(f"{top}/MODEL_CARD.md").read().decode()
    runtime = {name.split("/runtime/", 1)[1]: mode for name, mode in modes.items() if "/runtime/" in name}
    assert set(runtime) == {*LIBRARIES, PROGRAM, "include/forgekit_runtime.h", "include/forgekit_runtime.hpp"}
    assert runtime[PROGRAM] == 0o755
    command = next(line for line in card.splitlines() if "/runtime/forgekit-run " in line).split("#")[0].split()
    assert command[:2] == [f"./{top}/runtime/forgekit-run", top] and command[-2:] == ["-o", "out/"]

    root = rootfs.ensure_rootfs("arm", bare=True)
    guest_dir = Path("/opt") / f"forgekit-{uuid.uuid4().hex[:8]}"
    host_dir = root / guest_dir.relative_to("/")
    try:
        host_dir.mkdir(parents=True)
        with tarfile.open(archive) as tar:
            tar.extractall(host_dir, filter="tar")
        np.save(host_dir / "input.npy", convnet_input)
        argv = [str(guest_dir / command[0]), str(guest_dir / top), *[
            f"input={guest_dir / 'input.npy'}" if arg.endswith(".npy") else arg for arg in command[2:-1]],
            str(guest_dir / "out")]
        done = rootfs.run_in_rootfs(root, rootfs.guest("arm", bare=True), argv, timeout=600)
        assert done.returncode == 0, done.stderr
        got = np.load(host_dir / "out" / "probs.npy")
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)
    expected = ort_run(onnx.load(convnet_path), {"input": convnet_input})[0]
    np.testing.assert_allclose(got, expected, rtol=TOL, atol=TOL)


def test_a_build_tree_configured_from_another_checkout_is_dropped(tmp_path) -> None:
    """The kept build tree is per user: one CMake configured from another checkout's sources (a CI clone next
    to a working tree) failed the next configure ("does not match the source ... used to generate cache")."""
    from forgekit.deploy.cross import SOURCE_DIR, drop_foreign_tree

    here, other = SOURCE_DIR / "cross", tmp_path / "elsewhere" / "runtime" / "cross"
    for configured, kept in ((other, False), (here, True)):
        work = tmp_path / "work"
        work.mkdir(exist_ok=True)
        (work / "CMakeCache.txt").write_text(f"# cache\nCMAKE_HOME_DIRECTORY:INTERNAL={configured}\n")
        (work / "objects.o").write_bytes(b"\0")
        drop_foreign_tree(work, here)
        assert (work / "objects.o").exists() == kept
    drop_foreign_tree(tmp_path / "never-configured", here)  # nothing to drop
