"""The runtime a CUDA bundle carries (``publish(..., with_runtime=True)`` of a ``cuda/sm_XY`` artifact).

A CUDA artifact runs on an x86-64 GPU server, which often has no Python with TVM: its bundle gets ``runtime/``
with ``forgekit-run``, ``libforgekit_runtime.so`` and the TVM libraries of the installed apache-tvm wheel
(``libtvm_ffi.so``, ``libtvm_runtime.so`` and ``libtvm_runtime_cuda.so``, the wheel's CUDA 13 build), all
finding each other next to themselves (``$ORIGIN``).  Built with ``runtime/CMakeLists.txt -DFORGEKIT_BUNDLE=ON``
and this machine's g++, cached like the cross runtimes (``$FORGEKIT_CACHE/runtime/x86_64-cuda-<hash>``).

Not shipped, and said so on the card: NVIDIA's CUDA runtime ``libcudart.so.13`` (the ``nvidia-cuda-runtime``
wheel or the CUDA 13 toolkit) and the driver (``libcuda.so.1``, R580 or newer): the driver comes with the GPU,
and libcudart must match it, so the server brings both.  ``forgekit-run`` says in one line (exit 12) which
one is missing.  OpenSSL's libcrypto is linked only for encrypted artifacts (then the server needs
``libcrypto.so.3``, OpenSSL 3), so a plain bundle needs nothing else of the server but glibc and libstdc++.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

from ..errors import CompileError, ToolchainError
from ..log import last_line
from ..toolchain import host_cxx, publish_build, require, tool_version

#: what a CUDA bundle's runtime/ holds (flat: forgekit-run finds the libraries through $ORIGIN)
CUDA_RUNTIME_FILES = ("forgekit-run", "libforgekit_runtime.so", "libtvm_ffi.so", "libtvm_runtime.so",
                      "libtvm_runtime_cuda.so")
_STAMP = ".forgekit-runtime.txt"
#: Bump when the recipe changes in a way the hash of its inputs does not capture.
RECIPE_VERSION = 1


def _key(source: Path, wheel_files: list[Path], cxx: str, encryption: bool) -> str:
    digest = hashlib.sha256(f"v{RECIPE_VERSION}\0{tool_version(cxx)}\0{encryption}\0".encode())
    for path in sorted(p for p in source.rglob("*") if p.is_file() and p.suffix in (".h", ".hpp", ".cc", ".c")
                       and "cross" not in p.relative_to(source).parts):
        digest.update(str(path.relative_to(source)).encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update((source / "CMakeLists.txt").read_bytes())
    for path in wheel_files:  # the libraries shipped as they are: a reinstalled wheel is another bundle
        stat = path.stat()
        digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:16]


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise CompileError(f"Building the CUDA runtime failed in {what}: {last_line(done.stdout + done.stderr)}")


def build_cuda_runtime(encryption: bool = False, cache: str | Path | None = None,
                       log: Callable[[str], None] | None = None) -> list[Path]:
    """The files of ``runtime/`` for a CUDA bundle (:data:`CUDA_RUNTIME_FILES`), built or from the cache.

    ``encryption``: link OpenSSL's libcrypto (encrypted artifacts); a one-line :class:`ToolchainError` names
    the Debian package when it, CMake or g++ is missing, or when the apache-tvm wheel has no CUDA runtime.
    """
    from ..deploy.capi import SOURCE_DIR, has_openssl, wheel_dirs
    from ..deploy.cross import cache_dir

    cmake = require("cmake", "cmake")
    cxx = require(host_cxx(), "g++")
    ffi_dir, tvm_lib = wheel_dirs()
    wheel_files = [ffi_dir / "lib" / "libtvm_ffi.so", tvm_lib / "libtvm_runtime.so", tvm_lib / "libtvm_runtime_cuda.so"]
    if not wheel_files[-1].is_file():
        raise ToolchainError(f"The installed apache-tvm has no CUDA runtime ({wheel_files[-1]}): install the "
                             "apache-tvm wheel built with CUDA (the one forgekit pins ships it).")
    if encryption and not has_openssl(cxx):
        raise ToolchainError("OpenSSL's libcrypto is not installed (an encrypted artifact's runtime decrypts): "
                             "install the Debian package 'libssl-dev'.")
    root = Path(cache) if cache else cache_dir()
    final = root / f"x86_64-cuda-{_key(SOURCE_DIR, wheel_files, cxx, encryption)}"
    files = [final / name for name in CUDA_RUNTIME_FILES]
    if (final / _STAMP).is_file():
        return files
    root.mkdir(parents=True, exist_ok=True)
    say = log or (lambda message: None)
    with contextlib.ExitStack() as stack:
        lock = stack.enter_context(open(root / ".build-x86_64-cuda.lock", "w"))
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / _STAMP).is_file():  # another process built it while we waited
            return files
        work = Path(tempfile.mkdtemp(prefix=".build-x86_64-cuda.", dir=root))
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        say("compiling the x86-64 CUDA runtime (libforgekit_runtime.so, forgekit-run)")
        _run([cmake, "-S", str(SOURCE_DIR), "-B", str(work / "build"), "-DCMAKE_BUILD_TYPE=Release",
              f"-DCMAKE_CXX_COMPILER={cxx}", f"-DTVM_FFI_ROOT={ffi_dir}", f"-DTVM_ROOT={tvm_lib.parent}",
              "-DFORGEKIT_BUNDLE=ON", f"-DFORGEKIT_ENCRYPTION={'ON' if encryption else 'OFF'}"], "CMake (configure)")
        _run([cmake, "--build", str(work / "build"), "-j2"], "CMake (build)")
        _run([cmake, "--install", str(work / "build"), "--prefix", str(work / "install"), "--strip"], "CMake (install)")
        staged = work / "staged"
        staged.mkdir()
        for name in CUDA_RUNTIME_FILES:
            folder = "bin" if name == "forgekit-run" else "lib"
            shutil.copy2(work / "install" / folder / name, staged / name)
        publish_build(staged, final, _STAMP, f"x86_64 cuda encryption={encryption}\n")
    return files
