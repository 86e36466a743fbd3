"""Cross-build the TVM runtime and the forgekit C runtime for a target that has no apache-tvm wheel.

``libtvm_ffi.so``, ``libtvm_runtime.so`` (CPU only: the Relax VM, library modules, the thread pool),
``libforgekit_runtime.so`` and ``forgekit-run`` are compiled from the sources the installed apache-tvm and
apache-tvm-ffi wheels ship (``tvm/src/runtime``, ``tvm_ffi/src``) with ``runtime/cross/CMakeLists.txt``
and the target family's toolchain: ``aarch64-linux-gnu-g++`` (aarch64 Linux without Python),
``arm-linux-gnueabihf-g++`` (Raspberry Pi OS 32-bit), the Android NDK's clang (arm64-v8a, armeabi-v7a).

The apache-tvm wheel ships ``src/runtime`` and ``include/tvm/runtime`` but not the headers they include
from ``include/tvm/support``, ``src/support`` and ``3rdparty/compiler-rt`` (byte streams, the serializer
of the VM executable, half-float conversions), and apache-tvm has no sdist: those headers are vendored
for the pinned version in ``runtime/cross/tvm_support`` (see its README), or come from a TVM source tree
given with ``tvm_source`` / ``--tvm-source`` / ``$FORGEKIT_TVM_SOURCE``.  Everything else (every ``.cc``,
the runtime headers) is the wheel's.

Android needs the NDK (``ANDROID_NDK_HOME``): unlike an artifact, which is plain C and links against
stubs of Bionic's ``libc.so``, the TVM runtime is C++ and needs Bionic's headers and the NDK's libc++,
which Debian does not package.

Builds are cached like the qemu rootfs: under ``$FORGEKIT_CACHE/runtime`` (default
``~/.cache/forgekit/runtime``) in a directory named after a hash of the sources, the toolchain file
and the compiler's version; a build goes into a temporary directory renamed into place when complete.
A fresh build takes several minutes on 2 cores (``-j2``), a cached one a few file reads.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ArtifactError, CompileError, TargetError, ToolchainError
from ..log import last_line
from ..toolchain import publish_build, require, tool_version
from .capi import SOURCE_DIR, wheel_dirs
from .cross_toolchains import CrossToolchain, toolchain_for

#: what a build delivers (all next to each other: forgekit-run finds the libraries through $ORIGIN)
LIBRARIES = ("libtvm_ffi.so", "libtvm_runtime.so", "libforgekit_runtime.so")
PROGRAM = "forgekit-run"
_STAMP = ".forgekit-runtime.txt"
#: Bump when the recipe changes in a way the hash of its inputs does not capture.
RECIPE_VERSION = 1


@dataclass(frozen=True)
class CrossBuild:
    """One cached cross build of the runtime."""

    directory: Path
    toolchain: CrossToolchain
    files: tuple[Path, ...]  #: the libraries, forgekit-run, and the C++ library where one must be shipped

    @property
    def program(self) -> Path:
        return self.directory / PROGRAM

    def library(self, name: str) -> Path:
        return self.directory / name


def cache_dir() -> Path:
    """Root of the cross-runtime cache: ``$FORGEKIT_CACHE/runtime``, else ``$XDG_CACHE_HOME/forgekit/runtime``."""
    if os.environ.get("FORGEKIT_CACHE"):
        return Path(os.environ["FORGEKIT_CACHE"]) / "runtime"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "forgekit" / "runtime"


#: what the wheel lacks, taken from the TVM source tree (headers only)
_SUPPORT = ("include/tvm/support", "src/support", "3rdparty/compiler-rt")
#: those headers for the pinned apache-tvm, kept in this repository (runtime/cross/tvm_support/README.md)
VENDORED = SOURCE_DIR / "cross" / "tvm_support"


def tvm_source_dir(tvm_source: str | os.PathLike[str] | None = None) -> Path:
    """The TVM source tree that provides :data:`_SUPPORT`, or a one-line :class:`ToolchainError`."""
    given = tvm_source or os.environ.get("FORGEKIT_TVM_SOURCE") or VENDORED
    if not Path(given).is_dir():
        raise ToolchainError("The apache-tvm wheel lacks the include/tvm/support and src/support headers its runtime "
                             "sources need: pass --tvm-source (or set FORGEKIT_TVM_SOURCE) to a TVM source tree of "
                             "the installed version (git clone --depth 1 --branch v0.27.0 "
                             "https://github.com/apache/tvm).")
    root = Path(given)
    if not all((root / part).is_dir() for part in _SUPPORT):
        raise ToolchainError(f"'{root}' is not a TVM source tree (no {', '.join(_SUPPORT)}).")
    return root


def _stage_tvm(wheel: Path, source: Path, dest: Path) -> None:
    """The wheel's runtime sources and headers plus the source tree's support headers, in one tree (copy2
    keeps the times, so a retried build recompiles only what changed)."""
    shutil.copytree(wheel / "include", dest / "include", dirs_exist_ok=True)
    shutil.copytree(wheel / "src" / "runtime", dest / "src" / "runtime", dirs_exist_ok=True)
    for part in _SUPPORT:
        shutil.copytree(source / part, dest / part, dirs_exist_ok=True,
                        ignore=lambda _d, names: [n for n in names if n.endswith((".cc", ".c"))])


def _sources(ffi_dir: Path, tvm_dir: Path, tvm_source: Path, runtime: Path) -> list[tuple[str, Path]]:
    """Every file the build can read, with a name that does not depend on where the trees are (a TVM clone
    elsewhere, another venv with the same wheels, hit the same cache entry): hashed into the cache key."""
    trees = [("ffi", ffi_dir, ("src", "include")), ("tvm", tvm_dir, ("src/runtime", "include")),
             ("tvm", tvm_source, _SUPPORT), ("forgekit", runtime, ("src", "include", "examples", "cross"))]
    return sorted((f"{label}/{p.relative_to(base)}", p) for label, base, parts in trees for part in parts
                  for p in (base / part).rglob("*") if p.is_file() and p.suffix in (".h", ".hpp", ".cc", ".c", ".txt"))


def _key(files: list[tuple[str, Path]], toolchain: CrossToolchain, toolchain_file: str) -> str:
    digest = hashlib.sha256(f"v{RECIPE_VERSION}\0{toolchain_file}\0{tool_version(toolchain.cxx)}\0".encode())
    for name, path in files:
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def build_cross_runtime(tag: str, cache: str | os.PathLike[str] | None = None,
                        tvm_source: str | os.PathLike[str] | None = None, log=None) -> CrossBuild:
    """Build (or find in the cache) the runtime for the target ``tag`` (``raspberry-pi/4-armhf``,
    ``arm/aarch64``, ``android/arm64-v8a``...).

    Raises :class:`TargetError` for a target with no cross runtime (the host's, CUDA), and a one-line
    :class:`ToolchainError` naming the Debian package when a compiler or CMake is missing.
    """
    toolchain = toolchain_for(tag)
    cmake = require("cmake", "cmake")
    require(toolchain.cxx, toolchain.package)
    ffi_dir, tvm_lib = wheel_dirs()
    tvm_dir = tvm_lib.parent
    if not (tvm_dir / "src" / "runtime" / "vm" / "vm.cc").is_file() or not (ffi_dir / "src" / "ffi").is_dir():
        raise ArtifactError(f"The installed TVM wheels ship no runtime sources ({tvm_dir / 'src'}, "
                            f"{ffi_dir / 'src'}): reinstall apache-tvm and apache-tvm-ffi from wheels.")
    source = tvm_source_dir(tvm_source)
    toolchain_file = toolchain.cmake_file()
    key = _key(_sources(ffi_dir, tvm_dir, source, SOURCE_DIR), toolchain, toolchain_file)
    root = Path(cache) if cache else cache_dir()
    final = root / f"{toolchain.name}-{key}"
    names = (*LIBRARIES, PROGRAM, *toolchain.ship)
    build = CrossBuild(final, toolchain, tuple(final / Path(n).name for n in names))
    if (final / _STAMP).is_file():
        return build
    root.mkdir(parents=True, exist_ok=True)
    say = log or (lambda message: None)
    scratch = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=root))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, scratch, ignore_errors=True)
        start = time.monotonic()
        # one build tree per ABI, kept: a retry after a failure, or a build after a source change, recompiles
        # only what changed (ninja/make track the dependencies); the lock keeps two builds out of one tree
        work = root / f".build-{toolchain.name}"
        lock = stack.enter_context(open(root / f".build-{toolchain.name}.lock", "w"))
        fcntl.flock(lock, fcntl.LOCK_EX)
        drop_foreign_tree(work, SOURCE_DIR / "cross")
        work.mkdir(exist_ok=True)
        if (final / _STAMP).is_file():  # another process built it while we waited
            return build
        for stale in root.glob(f".{toolchain.name}-*.tmp"):  # a killed build's (we hold this ABI's lock)
            if stale != scratch:
                shutil.rmtree(stale, ignore_errors=True)
        (work / "toolchain.cmake").write_text(toolchain_file)
        _stage_tvm(tvm_dir, source, work / "tvm")
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        say(f"configuring the {toolchain.name} runtime")
        _run([cmake, "-S", str(SOURCE_DIR / "cross"), "-B", str(work), *generator,
              f"-DCMAKE_TOOLCHAIN_FILE={work / 'toolchain.cmake'}", "-DCMAKE_BUILD_TYPE=Release",
              f"-DTVM_FFI_ROOT={ffi_dir}", f"-DTVM_ROOT={work / 'tvm'}", f"-DFORGEKIT_RUNTIME={SOURCE_DIR}",
              *toolchain.cmake_args], "CMake (configure)", work)
        say(f"compiling the {toolchain.name} runtime (-j2)")
        _run([cmake, "--build", str(work), "-j2"], "CMake (build)", work)
        for name in names:
            built = Path(name) if os.path.isabs(name) else work / name
            shutil.copy2(built, scratch / built.name)
        seconds = time.monotonic() - start
        publish_build(scratch, final, _STAMP, f"{toolchain.name} {tag} build_seconds={seconds:.0f}\n")
        say(f"{toolchain.name} runtime built in {seconds:.0f} s: {final}")
    return build


def drop_foreign_tree(work: Path, source: Path) -> None:
    """Delete the kept build tree ``work`` when CMake configured it from another source folder: the cache is
    per user, and a second checkout (or an upgraded install elsewhere) would otherwise stop at "The source ...
    does not match the source ... used to generate cache" (seen with a CI clone next to a working tree)."""
    cache = work / "CMakeCache.txt"
    if not cache.is_file():
        return
    for line in cache.read_text(errors="replace").splitlines():
        if line.startswith("CMAKE_HOME_DIRECTORY:"):
            configured = line.split("=", 1)[1].strip()
            if Path(configured).resolve() != source.resolve():
                shutil.rmtree(work, ignore_errors=True)
            return


def install(build: CrossBuild, dest: str | os.PathLike[str]) -> list[Path]:
    """Copy the build's files into ``dest`` (created); returns the copied paths."""
    out = Path(dest)
    if out.exists() and not out.is_dir():
        raise ArtifactError(f"'{out}' exists and is not a directory.")
    out.mkdir(parents=True, exist_ok=True)
    copied = []
    for path in build.files:
        copied.append(Path(shutil.copy2(path, out / path.name)))
    return copied


def _run(argv: list[str], what: str, work: Path) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        text = done.stdout + done.stderr
        (work / "forgekit-build.log").write_text(text)
        errors = [line for line in text.splitlines() if "error:" in line.lower() or "Error:" in line]
        raise CompileError(f"{what} failed (exit {done.returncode}): {(errors or [last_line(text)])[0].strip()} "
                           f"(full log: {work / 'forgekit-build.log'})")


__all__ = ["CrossBuild", "LIBRARIES", "PROGRAM", "TargetError", "ToolchainError", "build_cross_runtime",
           "cache_dir", "install"]
