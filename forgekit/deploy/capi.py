"""Build the forgekit C runtime for this machine: ``libforgekit_runtime.so`` (the C API of
``runtime/include/forgekit_runtime.h``) and the ``forgekit-run`` program, with the system C++ compiler
against the TVM runtime of the installed apache-tvm wheel (``libtvm_runtime.so``, ``libtvm_ffi.so``,
tvm_ffi's headers).

The commands are those of ``runtime/CMakeLists.txt``, run without CMake.  Builds are cached: each goes
into ``OUT/<hash>/``, the hash covering the sources, the compiler's version, the wheel's paths and
whether OpenSSL is used, so a second call with nothing changed costs a few file reads (a fresh build
takes about 8 s on 2 cores).  Only the host is built here; cross-compiling is not this module's job.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import ArtifactError, CompileError, ToolchainError
from ..toolchain import host_cxx, require, tool_version

#: the C runtime's sources: ``runtime/`` at the top of the forgekit checkout
SOURCE_DIR = Path(__file__).resolve().parents[2] / "runtime"
LIBRARY_NAME = "libforgekit_runtime.so"
PROGRAM_NAME = "forgekit-run"
_LIB_SOURCES = ("src/forgekit_runtime.cc", "src/metadata.cc", "src/host_check.cc", "src/decrypt.cc")
_CXXFLAGS = ("-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-Wall")


@dataclass(frozen=True)
class CapiBuild:
    """Where one build of the C runtime is."""

    directory: Path
    library: Path
    program: Path
    include: Path
    encryption: bool  #: built with OpenSSL's libcrypto (encrypted artifacts load)
    rpath: tuple[str, ...]  #: where the TVM libraries are found at run time


def wheel_dirs() -> tuple[Path, Path]:
    """(tvm_ffi package dir, directory of libtvm_runtime.so), located without importing the compiler."""
    from ..runtime.loader import runtime_library

    spec = importlib.util.find_spec("tvm_ffi")
    if spec is None or spec.origin is None:
        raise ArtifactError("tvm_ffi is not installed: install apache-tvm (it brings apache-tvm-ffi).")
    runtime = runtime_library()
    if not runtime.is_file():
        raise ArtifactError(f"TVM runtime library '{runtime}' does not exist: install apache-tvm or set "
                            "FORGEKIT_TVM_RUNTIME.")
    return Path(spec.origin).parent, runtime.parent


def has_openssl(cxx: str) -> bool:
    """True when ``cxx`` finds OpenSSL's headers (libssl-dev) and can link libcrypto."""
    with tempfile.TemporaryDirectory(prefix="forgekit-capi-") as scratch:
        probe = Path(scratch) / "probe.cc"
        probe.write_text("#include <openssl/evp.h>\nint main() { return EVP_aes_256_gcm() == nullptr; }\n")
        done = subprocess.run([cxx, str(probe), "-o", str(Path(scratch) / "probe"), "-lcrypto"],
                              capture_output=True, text=True, check=False)
        return done.returncode == 0


def _digest(source: Path, cxx: str, dirs: tuple[Path, Path], encryption: bool) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in source.rglob("*") if p.is_file() and p.suffix in (".h", ".hpp", ".cc", ".c")):
        digest.update(str(path.relative_to(source)).encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update("\0".join([tool_version(cxx), *map(str, dirs), str(encryption), *_CXXFLAGS]).encode())
    return digest.hexdigest()[:16]


def _compile(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if "error" in line] or done.stderr.splitlines() or ["?"]
        raise CompileError(f"Building {what} failed: {lines[0].strip()}")


def build_capi(out_dir: str | os.PathLike[str], source_dir: str | os.PathLike[str] | None = None,
               encryption: bool | None = None) -> CapiBuild:
    """Build (or find in the cache under ``out_dir``) the C runtime library and ``forgekit-run``.

    ``encryption``: link OpenSSL's libcrypto so encrypted artifacts load (default: when it is installed;
    ``True`` without it is a one-line :class:`ToolchainError` naming the package).
    """
    source = Path(source_dir) if source_dir else SOURCE_DIR
    if not (source / "include" / "forgekit_runtime.h").is_file():
        raise ArtifactError(f"'{source}' has no include/forgekit_runtime.h: pass the runtime/ folder of a forgekit "
                            "checkout.")
    cxx = require(host_cxx(), "g++")
    ffi_dir, tvm_lib = wheel_dirs()
    if encryption is None:
        encryption = has_openssl(cxx)
    elif encryption and not has_openssl(cxx):
        raise ToolchainError("OpenSSL's libcrypto is not installed (needed for encrypted artifacts): install the "
                             "Debian package 'libssl-dev'.")
    key = _digest(source, cxx, (ffi_dir, tvm_lib), encryption)
    rpath = (str(ffi_dir / "lib"), str(tvm_lib))
    final = Path(out_dir) / key
    build = CapiBuild(final, final / LIBRARY_NAME, final / PROGRAM_NAME, source / "include", encryption, rpath)
    if build.library.is_file() and build.program.is_file():
        return build
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=out_dir))
    try:
        library = scratch / LIBRARY_NAME
        crypto = ["-lcrypto"] if encryption else []
        _compile([cxx, *_CXXFLAGS, "-shared", f"-I{ffi_dir / 'include'}", *(str(source / s) for s in _LIB_SOURCES),
                  *([] if encryption else ["-DFORGEKIT_NO_CRYPTO"]), "-o", str(library), f"-Wl,-soname,{LIBRARY_NAME}",
                  # libtvm_runtime.so is needed although no symbol of it is referenced: loading it registers
                  # the Relax VM executable loader
                  str(ffi_dir / "lib" / "libtvm_ffi.so"), "-Wl,--no-as-needed", str(tvm_lib / "libtvm_runtime.so"),
                  "-Wl,--as-needed", *crypto, "-ldl", f"-Wl,-rpath,{':'.join(rpath)}"], LIBRARY_NAME)
        _compile([cxx, "-std=c++17", "-O2", "-Wall", f"-I{source / 'include'}",
                  str(source / "examples" / "forgekit_run.cc"), "-o", str(scratch / PROGRAM_NAME), str(library),
                  "-Wl,-rpath,$ORIGIN"], PROGRAM_NAME)
        scratch.chmod(0o755)
        try:
            scratch.rename(final)
        except OSError:  # another process finished the same build first: theirs is as good
            if not build.library.is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return build


def build_program(source: str | os.PathLike[str], build: CapiBuild, name: str | None = None) -> Path:
    """Compile a C or C++ program using the C API (``source``) against ``build``; returns the executable,
    next to the library (rebuilt when the source is newer)."""
    source = Path(source)
    program = build.directory / (name or source.stem)
    if program.is_file() and program.stat().st_mtime >= source.stat().st_mtime:
        return program
    compiler = "gcc" if source.suffix == ".c" else host_cxx()
    standard = ["-std=c99", "-pedantic"] if source.suffix == ".c" else ["-std=c++17"]
    _compile([require(compiler, "gcc"), *standard, "-O2", "-Wall", "-Wextra", f"-I{build.include}", str(source),
              "-o", str(program), str(build.library), "-Wl,-rpath,$ORIGIN"], source.name)
    return program
