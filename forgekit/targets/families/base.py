"""The protocol every target family implements (link, describe, run), and the shared plumbing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

from ...errors import ToolchainError
from ...runtime.cpu import host_arch, normalize_arch
from ...toolchain import host_cxx, require, tool_version

if TYPE_CHECKING:
    from ...devices import Device
    from ..parse import TargetSpec


class Family(Protocol):
    """What forgekit needs to know about a kind of machine."""

    #: Human name, e.g. "aarch64 Linux".
    DESCRIPTION: str
    #: where its artifacts run: the operating system ("linux", "android") and the device kind ("cpu",
    #: "cuda"), recorded in the metadata so a runtime can tell, without knowing any family, whether it
    #: can run one
    OS: str
    DEVICE: str

    def linker(self, spec: TargetSpec) -> Callable[..., Any] | None:
        """``fcompile`` for ``Executable.export_library`` (``None``: TVM's default host compiler).

        Raises :class:`ToolchainError` naming the package to install when the linker is missing.
        """

    def toolchain(self, spec: TargetSpec) -> dict[str, str]:
        """Names and versions of the tools that link this family's artifacts (for metadata)."""

    def export_options(self, spec: TargetSpec, opt_level: int) -> dict[str, Any]:
        """Extra ``Executable.export_library`` arguments of the host side (a device kind's backend adds its own,
        CUDA's fatbin: :mod:`forgekit.backends.link`)."""

    def device(self, arch: str, log: Callable[[str], None] | None = None) -> Device | None:
        """Where this machine can run an artifact of this family built for ``arch`` (None: nowhere)."""


def local_or_emulated(arch: str, log: Callable[[str], None] | None = None) -> Device | None:
    """This machine for its own architecture, qemu for one it can emulate, else None."""
    from ...devices.local import LocalDevice
    from ...devices.rootfs import GUESTS

    if arch == host_arch():
        return LocalDevice()
    if arch in GUESTS:
        from ...devices.qemu import QemuDevice

        return QemuDevice(arch, log)
    return None


class GnuFamily:
    """A Linux family linked by GCC: the host ``g++`` on its own machine, ``<triple>-g++`` elsewhere."""

    OS = "linux"
    DEVICE = "cpu"

    def __init__(self, description: str, machine: str, cross_cxx: str, package: str, image: str | None) -> None:
        self.DESCRIPTION = description
        self.machine, self.cross_cxx, self.package, self.image = machine, cross_cxx, package, image

    def _native(self) -> bool:
        return host_arch() == normalize_arch(self.machine)

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

    def export_options(self, spec: TargetSpec, opt_level: int) -> dict[str, Any]:
        return {}

    def device(self, arch: str, log: Callable[[str], None] | None = None) -> Device | None:
        return local_or_emulated(arch, log)


class _Native:
    """Artifacts for the machine forgekit runs on: TVM's default linker (g++)."""

    DESCRIPTION = "this machine"
    OS = "linux"
    DEVICE = "cpu"

    def linker(self, spec: TargetSpec) -> Callable[..., Any] | None:
        if spec.is_cross:
            raise ToolchainError(f"forgekit knows no linker for '{spec.triple}': use a target of the x86, arm, "
                                 "android or cuda families ('forgekit targets' lists them).")
        require(host_cxx(), "g++")
        return None

    def toolchain(self, spec: TargetSpec) -> dict[str, str]:
        return {"linker": host_cxx(), "linker_version": tool_version(host_cxx())}

    def export_options(self, spec: TargetSpec, opt_level: int) -> dict[str, Any]:
        return {}

    def device(self, arch: str, log: Callable[[str], None] | None = None) -> Device | None:
        return local_or_emulated(arch, log)


native = _Native()
