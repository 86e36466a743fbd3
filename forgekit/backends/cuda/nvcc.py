"""CUDA kernels compiled at build time: nvcc turns TVM's CUDA C into a fatbin (SASS + PTX).

TVM 0.27 hands the generated CUDA C to ``tvm_callback_cuda_compile`` only when a CUDA driver is present
on the build machine; otherwise it stores the *source* in the library and the deployed runtime has to
compile it at load time (through TVM's Python callback and NVRTC).  forgekit compiles every kernel with
nvcc during the build instead, so the artifact needs neither nvcc, NVRTC nor Python on the device:

* :func:`scoped_compile_callback` replaces ``tvm_callback_cuda_compile`` for the duration of one build
  (used when TVM does call it, i.e. on a machine with a GPU driver) and restores TVM's own afterwards;
* :func:`compile_fatbin` is what both paths run, also used by :mod:`forgekit.devpack` to compile the
  source TVM left in the library on driverless build machines.

The fatbin holds SASS for the target's architecture (runs as is) and PTX for the same virtual
architecture (the driver JIT-compiles it for newer GPUs: forward compatibility).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import subprocess
import tempfile
from typing import Iterator

from ...errors import CompileError, ToolchainError

# CUDA 13 dropped Maxwell, Pascal and Volta (Jetson Nano sm_53, TX2 sm_62, Xavier sm_72); CUDA 12.x is
# the last toolkit that builds for them.
_OLD_ARCH_TOOLKIT = "CUDA 12.x or older"

# nvcc flags TVM itself uses for its generated code (half/bfloat16 operators are guarded by these).
_TVM_FLAGS = [
    "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT162_OPERATORS__", "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
    "--expt-relaxed-constexpr",
]


def _wheel_nvcc() -> str | None:
    """nvcc from NVIDIA's PyPI wheels (``pip install forgekit[cuda]``) in this Python environment.

    The wheels put the toolkit under ``site-packages/nvidia/cu<major>/``; nvcc finds its headers, crt and
    nvvm relative to its own path, so it runs from there without a system CUDA install.
    """
    import glob
    import sysconfig

    found = sorted(glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "nvidia", "cu*", "bin", "nvcc")))
    return next((p for p in reversed(found) if os.access(p, os.X_OK)), None)


def find_nvcc() -> str:
    """Path of nvcc: ``$CUDA_HOME/bin/nvcc``, else on PATH, else from the ``forgekit[cuda]`` wheels.

    A one-line :class:`ToolchainError` naming the package when there is none.
    """
    import shutil

    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        # An explicit toolkit wins, and a wrong one is an error rather than a silent fallback.
        if os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
            return os.path.join(home, "bin", "nvcc")
        raise ToolchainError(f"CUDA_HOME={home} has no bin/nvcc: point it at a CUDA toolkit or unset it.")
    found = shutil.which("nvcc") or _wheel_nvcc()
    if found is None:
        raise ToolchainError("'nvcc' is not installed: pip install 'forgekit[cuda]' (NVIDIA's nvcc wheels), "
                             "install the Debian package 'nvidia-cuda-toolkit', or use the forgekit 'cuda' image.")
    return found


@functools.lru_cache(maxsize=8)
def _nvcc_info(nvcc: str) -> tuple[str, tuple[int, ...]]:
    """(release such as "13.0", supported real architectures as integers) of one nvcc binary."""
    try:
        version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
        codes = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolchainError(f"'{nvcc}' cannot be run ({exc}): reinstall the CUDA toolkit.") from None
    release = re.search(r"release (\d+\.\d+)", version)
    archs = sorted({int(m) for m in re.findall(r"^sm_(\d+)[a-z]?$", codes, flags=re.M)})
    return (release.group(1) if release else "unknown"), tuple(archs)


def nvcc_version(nvcc: str | None = None) -> str:
    """CUDA release of nvcc, e.g. ``"13.0"`` (``""`` when nvcc is missing)."""
    try:
        return _nvcc_info(nvcc or find_nvcc())[0]
    except ToolchainError:
        return ""


def arch_number(arch: str) -> int:
    """``"sm_87"`` -> 87 (a ``TargetError``-free parse: the target parser validated ``arch`` already)."""
    match = re.fullmatch(r"sm_(\d+)[a-z]?", arch)
    if not match:
        raise ToolchainError(f"CUDA arch '{arch}' is not of the form sm_XY: give e.g. 'cuda -arch=sm_80'.")
    return int(match.group(1))


def check_arch(arch: str, nvcc: str | None = None) -> str:
    """Make sure this nvcc can build ``arch``; returns the nvcc path.  One-line error otherwise."""
    nvcc = nvcc or find_nvcc()
    release, supported = _nvcc_info(nvcc)
    number = arch_number(arch)
    if supported and number not in supported:
        if number < supported[0]:
            need = _OLD_ARCH_TOOLKIT if number < 75 else "an older CUDA toolkit"
        else:
            need = "a newer CUDA toolkit"
        raise ToolchainError(f"nvcc {release} cannot build for {arch} (it supports sm_{supported[0]} to "
                             f"sm_{supported[-1]}): install {need} and put its nvcc on PATH (or set CUDA_HOME).")
    return nvcc


def gencode_flags(arch: str) -> list[str]:
    """SASS for ``arch`` plus PTX of the same virtual architecture (JIT-able by newer drivers)."""
    suffix = arch.split("_", 1)[1]
    return ["-gencode", f"arch=compute_{suffix},code=sm_{suffix}",
            "-gencode", f"arch=compute_{suffix},code=compute_{suffix}"]


def compile_fatbin(source: str, arch: str, fast_math: bool = False) -> bytes:
    """Compile TVM-generated CUDA C to a fatbin for ``arch`` with nvcc.

    ``fast_math`` adds ``--use_fast_math`` (opt_level 4, like LLVM fast-math on CPUs): approximate
    division, square root and transcendental functions.
    """
    nvcc = check_arch(arch)
    with tempfile.TemporaryDirectory(prefix="forgekit-nvcc-") as tmp:
        src, out = os.path.join(tmp, "kernels.cu"), os.path.join(tmp, "kernels.fatbin")
        with open(src, "w") as handle:
            handle.write(source)
        cmd = [nvcc, "--fatbin", "-O3", *gencode_flags(arch), *_TVM_FLAGS,
               *(["--use_fast_math"] if fast_math else []), "-o", out, src]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
            detail = next((ln for ln in lines if "error" in ln.lower()), lines[-1] if lines else "no output")
            raise CompileError(f"nvcc failed to compile the CUDA kernels for {arch}: {detail.strip()}")
        with open(out, "rb") as handle:
            return handle.read()


@contextlib.contextmanager
def scoped_compile_callback(arch: str, fast_math: bool = False) -> Iterator[None]:
    """Make ``tvm_callback_cuda_compile`` use :func:`compile_fatbin` inside the ``with`` block only.

    TVM calls it while building when a CUDA driver is installed; the previous callback (TVM's NVRTC
    one) is restored on exit so forgekit leaves no global state changed.
    """
    import tvm_ffi

    name = "tvm_callback_cuda_compile"
    previous = tvm_ffi.get_global_func(name, allow_missing=True)

    def compile_callback(code: str, *_: object) -> bytes:
        return compile_fatbin(str(code), arch, fast_math)

    tvm_ffi.register_global_func(name, compile_callback, override=True)
    try:
        yield
    finally:
        if previous is not None:
            tvm_ffi.register_global_func(name, previous, override=True)
        else:
            tvm_ffi.remove_global_func(name)

