"""NVIDIA CUDA: host code linked for the host CPU's family, run where a GPU is.

The device side (nvcc checked, kernels packed as a fatbin, the toolchain and GPU the metadata names) is the CUDA
backend's: :mod:`forgekit.backends.cuda.export`, joined to this family by :mod:`forgekit.backends.link`.  So the
build machine needs nvcc for the target's architecture but no GPU, and the device needs neither nvcc nor NVRTC.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:
    from ..parse import TargetSpec


class CudaFamily:
    """CUDA targets: the host CPU's family links and describes them (looked up in ``host_families``, the registry
    this family is part of); the kernels are the CUDA backend's."""

    DESCRIPTION = "NVIDIA CUDA"
    OS = "linux"
    DEVICE = "cuda"

    def __init__(self, host_families: Mapping[str, Any]) -> None:
        self._host_families = host_families

    def _host(self, spec: TargetSpec) -> Any:
        return self._host_families[spec.host_family]

    def linker(self, spec: TargetSpec) -> Callable[..., Any] | None:
        """The host family's linker."""
        return self._host(spec).linker(spec)

    def toolchain(self, spec: TargetSpec) -> dict[str, str]:
        """The host family's linker (nvcc: :func:`forgekit.backends.cuda.export.toolchain`)."""
        return self._host(spec).toolchain(spec)

    def export_options(self, spec: TargetSpec, opt_level: int) -> dict[str, Any]:
        """The host family's (the fatbin: :func:`forgekit.backends.cuda.export.export_options`)."""
        return self._host(spec).export_options(spec, opt_level)

    def device(self, arch: str, log: Callable[[str], None] | None = None) -> Any:
        """This machine when it is the artifact's host architecture and has an NVIDIA GPU (the Engine loads the
        CUDA runtime and checks the GPU's architecture); None elsewhere (verify says what it needs)."""
        from ...devices.local import LocalDevice
        from ...runtime.cpu import host_arch
        from ...runtime.device import has_nvidia_gpu

        return LocalDevice() if arch == host_arch() and has_nvidia_gpu() else None
