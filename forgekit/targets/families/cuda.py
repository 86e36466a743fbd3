"""NVIDIA CUDA: device kernels from TVM's CUDA codegen, host code linked for the host CPU's family."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from .base import tool_version

if TYPE_CHECKING:
    from ..parse import TargetSpec

DESCRIPTION = "NVIDIA CUDA"


def _host_family(spec: TargetSpec):
    from . import get_family
    from ..parse import _family_of

    return get_family(_family_of(spec.host_dict, None))


def linker(spec: TargetSpec) -> Callable[..., Any] | None:
    return _host_family(spec).linker(spec)


def toolchain(spec: TargetSpec) -> dict[str, str]:
    info = dict(_host_family(spec).toolchain(spec))
    info["nvcc_version"] = tool_version("nvcc")
    return info
