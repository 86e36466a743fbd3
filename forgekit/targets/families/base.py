"""The protocol every target family implements, and the shared linker plumbing."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import TYPE_CHECKING, Any, Callable, Protocol

from ...errors import ToolchainError

if TYPE_CHECKING:
    from ..parse import TargetSpec


class Family(Protocol):
    """What forgekit needs to know about a kind of machine."""

    #: Human name, e.g. "aarch64 Linux".
    DESCRIPTION: str

    def linker(self, spec: TargetSpec) -> Callable[..., Any] | None:
        """``fcompile`` for ``Executable.export_library`` (``None``: TVM's default host compiler).

        Raises :class:`ToolchainError` naming the package to install when the linker is missing.
        """

    def toolchain(self, spec: TargetSpec) -> dict[str, str]:
        """Names and versions of the tools that link this family's artifacts (for metadata)."""


def require(tool: str, package: str, image: str | None = None) -> str:
    """Path of ``tool`` on PATH, or a one-line :class:`ToolchainError` saying how to get it."""
    path = shutil.which(tool)
    if path is None:
        where = f" or use the forgekit '{image}' image" if image else ""
        raise ToolchainError(f"'{tool}' is not installed: install the Debian package '{package}'{where}.")
    return path


def tool_version(tool: str) -> str:
    """First line of ``tool --version`` (empty when it cannot be run)."""
    path = shutil.which(tool)
    if not path:
        return ""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr).strip() else ""


def host_cxx() -> str:
    """The C++ compiler TVM uses for native artifacts (``CXX`` or ``g++``)."""
    return os.environ.get("CXX", "g++")


class GnuFamily:
    """A Linux family linked by GCC: the host ``g++`` on its own machine, ``<triple>-g++`` elsewhere."""

    def __init__(self, description: str, machine: str, cross_cxx: str, package: str, image: str | None) -> None:
        self.DESCRIPTION = description
        self.machine, self.cross_cxx, self.package, self.image = machine, cross_cxx, package, image

    def _native(self) -> bool:
        return os.uname().machine == self.machine

    def cxx(self) -> str:
        return host_cxx() if self._native() else self.cross_cxx

    def linker(self, spec: TargetSpec) -> Callable[..., Any] | None:
        if self._native():
            require(host_cxx(), "g++")
            return None
        from tvm.support import cc

        return cc.cross_compiler(require(self.cross_cxx, self.package, image=self.image))

    def toolchain(self, spec: TargetSpec) -> dict[str, str]:
        return {"linker": self.cxx(), "linker_version": tool_version(self.cxx())}


class _Native:
    """Artifacts for the machine forgekit runs on: TVM's default linker (g++)."""

    DESCRIPTION = "this machine"

    def linker(self, spec: TargetSpec) -> Callable[..., Any] | None:
        if spec.is_cross:
            raise ToolchainError(f"forgekit knows no linker for '{spec.triple}': use a target of the x86, arm, "
                                 "android or cuda families ('forgekit targets' lists them).")
        require(host_cxx(), "g++")
        return None

    def toolchain(self, spec: TargetSpec) -> dict[str, str]:
        return {"linker": host_cxx(), "linker_version": tool_version(host_cxx())}


native = _Native()
