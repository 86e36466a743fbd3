"""NVIDIA CUDA: device kernels compiled by nvcc at build time, host code linked for the host CPU's family.

The kernels go into the library as a fatbin (see :mod:`forgekit.nvcc`), so the build machine needs nvcc
for the target's architecture but no GPU, and the device needs neither nvcc nor NVRTC.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from ...errors import TargetError

if TYPE_CHECKING:
    from ..parse import TargetSpec

DESCRIPTION = "NVIDIA CUDA"


def _host_family(spec: TargetSpec):
    from . import get_family
    from ..parse import _family_of

    return get_family(_family_of(spec.host_dict, None))


def cuda_arch(spec: TargetSpec) -> str:
    """The GPU architecture (``sm_87``) the kernels are built for.

    TVM silently falls back to ``sm_50`` when none is given and no GPU is present; forgekit asks instead,
    because the build machine usually is not the deployment GPU.
    """
    arch = spec.target.get("arch")
    if not arch:
        raise TargetError(f"Target '{spec.name}' names no GPU architecture: add -arch=sm_XY (e.g. "
                          "'cuda -arch=sm_86') or use a tag such as cuda/sm_86 or jetson/orin.")
    return str(arch)


def linker(spec: TargetSpec) -> Callable[..., Any] | None:
    """Check nvcc can build the kernels for the target's arch, then return the host family's linker."""
    from ...nvcc import check_arch

    check_arch(cuda_arch(spec))
    return _host_family(spec).linker(spec)


def toolchain(spec: TargetSpec) -> dict[str, str]:
    """The host linker plus nvcc (path, CUDA release) and the GPU architecture of the kernels."""
    from ...nvcc import find_nvcc, nvcc_version

    info = dict(_host_family(spec).toolchain(spec))
    info["nvcc"] = find_nvcc()
    info["nvcc_version"] = nvcc_version()
    info["cuda_arch"] = cuda_arch(spec)
    info["device_code"] = "fatbin"
    return info
