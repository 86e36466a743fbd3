"""What the CUDA backend adds to an artifact: nvcc checked before the build, the kernels packed into the library
at export as a fatbin, and the toolchain and GPU the metadata names (``build.toolchain``, ``build.device``).

The host side of a CUDA target (its linker, OS, where it runs) is the host CPU's family
(:class:`forgekit.targets.families.cuda.CudaFamily`); :mod:`forgekit.backends.link` puts the two together.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...targets import TargetSpec

#: the oldest NVIDIA Linux driver branch that runs code built by each CUDA release (NVIDIA's CUDA Toolkit release
#: notes, "minimum required driver version" for minor version compatibility)
MIN_DRIVER = {"11": "450", "12": "525", "13": "580"}
#: GPU generation of each compute capability, for the line a person reads
GENERATION = {**dict.fromkeys(("50", "52", "53"), "Maxwell"), **dict.fromkeys(("60", "61", "62"), "Pascal"),
              **dict.fromkeys(("70", "72"), "Volta"), "75": "Turing", **dict.fromkeys(("80", "86", "87"), "Ampere"),
              "89": "Ada", "90": "Hopper", **dict.fromkeys(("100", "101", "103", "110", "120", "121"), "Blackwell")}


def requirements(arch: str, cuda: str) -> dict[str, str]:
    """What a machine needs to run kernels built by CUDA ``cuda`` for ``arch``: metadata's ``build.device``."""
    number = arch.split("_", 1)[-1].rstrip("abf")
    out = {"gpu_arch": arch, "gpu_generation": GENERATION.get(number, "")}
    if cuda:
        out.update(cuda=cuda, min_driver=MIN_DRIVER.get(cuda.split(".")[0], ""))
    return out


def check(spec: TargetSpec) -> None:
    """nvcc can build kernels for the target's arch: one line naming what to install otherwise, before a long
    build."""
    from .nvcc import check_arch

    check_arch(spec.cuda_arch)


def toolchain(spec: TargetSpec) -> dict[str, str]:
    """nvcc (path, CUDA release) and the GPU architecture of the kernels, next to the host linker's entries."""
    from .nvcc import find_nvcc, nvcc_version

    return {"nvcc": find_nvcc(), "nvcc_version": nvcc_version(), "cuda_arch": spec.cuda_arch, "device_code": "fatbin"}


def device_requirements(spec: TargetSpec) -> dict[str, str]:
    """The GPU architecture, CUDA release and driver branch the artifact needs."""
    from .nvcc import nvcc_version

    return requirements(spec.cuda_arch, nvcc_version())


def export_options(spec: TargetSpec, opt_level: int) -> dict[str, Any]:
    """Pack the kernels compiled by nvcc (a fatbin) into the library."""
    from . import devpack, nvcc

    arch, fast_math = spec.cuda_arch, opt_level >= 4
    return {"fpack_imports": devpack.pack_imports(lambda source: nvcc.compile_fatbin(source, arch, fast_math))}


def with_extensions(executable: Any, fcompile: Any) -> tuple[Any, list[str]]:
    """``fcompile`` compiling in the runtime extensions ``executable`` calls (cuDNN's convolutions:
    :mod:`.cudnn`, cuBLAS's matmuls: :mod:`.cublas`), and the shared libraries they add to what the artifact
    needs where it runs."""
    from . import cublas, cudnn

    libraries = []
    if cudnn.calls_cudnn(executable):
        fcompile, libraries = cudnn.with_extension(fcompile), [*libraries, cudnn.LIBRARIES[0]]
    if cublas.calls_cublas(executable):
        fcompile, libraries = cublas.with_extension(fcompile), [*libraries, cublas.LIBRARIES[0]]
    return fcompile, libraries
