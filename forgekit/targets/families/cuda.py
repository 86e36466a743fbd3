"""NVIDIA CUDA: device kernels compiled by nvcc at build time, host code linked for the host CPU's family.

The kernels go into the library as a fatbin (see :mod:`forgekit.backends.cuda.nvcc`), so the build machine needs nvcc
for the target's architecture but no GPU, and the device needs neither nvcc nor NVRTC.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:
    from ..parse import TargetSpec

#: the oldest NVIDIA Linux driver branch that runs code built by each CUDA release (NVIDIA's CUDA Toolkit release
#: notes, "minimum required driver version" for minor version compatibility)
MIN_DRIVER = {"11": "450", "12": "525", "13": "580"}
#: GPU generation of each compute capability, for the line a person reads
GENERATION = {**dict.fromkeys(("50", "52", "53"), "Maxwell"), **dict.fromkeys(("60", "61", "62"), "Pascal"),
              **dict.fromkeys(("70", "72"), "Volta"), "75": "Turing", **dict.fromkeys(("80", "86", "87"), "Ampere"),
              "89": "Ada", "90": "Hopper", **dict.fromkeys(("100", "101", "103", "110", "120", "121"), "Blackwell")}


def device_requirements(arch: str, cuda: str) -> dict[str, str]:
    """What a machine needs to run kernels built by CUDA ``cuda`` for ``arch``: metadata's ``build.device``."""
    number = arch.split("_", 1)[-1].rstrip("abf")
    out = {"gpu_arch": arch, "gpu_generation": GENERATION.get(number, "")}
    if cuda:
        out.update(cuda=cuda, min_driver=MIN_DRIVER.get(cuda.split(".")[0], ""))
    return out


class CudaFamily:
    """CUDA targets: nvcc for the kernels, the host CPU's family for the rest (looked up in ``host_families``,
    the registry this family is part of)."""

    DESCRIPTION = "NVIDIA CUDA"
    OS = "linux"
    DEVICE = "cuda"

    def __init__(self, host_families: Mapping[str, Any]) -> None:
        self._host_families = host_families

    def _host(self, spec: TargetSpec) -> Any:
        return self._host_families[spec.host_family]

    def linker(self, spec: TargetSpec) -> Callable[..., Any] | None:
        """Check nvcc can build the kernels for the target's arch, then return the host family's linker."""
        from ...backends.cuda.nvcc import check_arch

        check_arch(spec.cuda_arch)
        return self._host(spec).linker(spec)

    def toolchain(self, spec: TargetSpec) -> dict[str, str]:
        """The host linker plus nvcc (path, CUDA release) and the GPU architecture of the kernels."""
        from ...backends.cuda.nvcc import find_nvcc, nvcc_version

        info = dict(self._host(spec).toolchain(spec))
        info.update(nvcc=find_nvcc(), nvcc_version=nvcc_version(), cuda_arch=spec.cuda_arch, device_code="fatbin")
        return info

    def device_requirements(self, spec: TargetSpec) -> dict[str, str]:
        """The GPU architecture, CUDA release and driver branch the artifact needs (metadata ``build.device``)."""
        from ...backends.cuda.nvcc import nvcc_version

        return device_requirements(spec.cuda_arch, nvcc_version())

    def export_options(self, spec: TargetSpec, opt_level: int) -> dict[str, Any]:
        """Pack the kernels compiled by nvcc (a fatbin) into the library."""
        from ...backends.cuda import devpack, nvcc

        arch, fast_math = spec.cuda_arch, opt_level >= 4
        return {"fpack_imports": devpack.pack_imports(lambda source: nvcc.compile_fatbin(source, arch, fast_math))}

    def device(self, arch: str, log: Callable[[str], None] | None = None) -> Any:
        """This machine when it is the artifact's host architecture and has an NVIDIA GPU (the Engine loads the
        CUDA runtime and checks the GPU's architecture); None elsewhere (verify says what it needs)."""
        from ...devices.local import LocalDevice
        from ...runtime.cpu import host_arch
        from ...runtime.device import has_nvidia_gpu

        return LocalDevice() if arch == host_arch() and has_nvidia_gpu() else None
