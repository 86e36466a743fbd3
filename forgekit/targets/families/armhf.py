"""32-bit ARMv7 hard-float Linux (Raspberry Pi OS 32-bit): GNU cross toolchain."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from .base import require, tool_version

if TYPE_CHECKING:
    from ..parse import TargetSpec

DESCRIPTION = "ARMv7 hard-float Linux"
CROSS_CXX = "arm-linux-gnueabihf-g++"
PACKAGE = "g++-arm-linux-gnueabihf"


def linker(spec: TargetSpec) -> Callable[..., Any] | None:
    from tvm.support import cc

    return cc.cross_compiler(require(CROSS_CXX, PACKAGE, image="aarch64"))


def toolchain(spec: TargetSpec) -> dict[str, str]:
    return {"linker": CROSS_CXX, "linker_version": tool_version(CROSS_CXX)}
