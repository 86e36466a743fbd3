"""Where an artifact runs when it is proven or timed: this machine, a qemu chroot, a board over TVM RPC.

Each place is a :class:`Device` (:mod:`.local`, :mod:`.qemu`, :mod:`.rpc_device`); the target family of an
artifact says which one can run it (``forgekit.targets.get_family(name).device(arch)``).  The program
that runs on the device side is :mod:`.runner`; it needs only ``forgekit.runtime``.

This ``__init__`` imports nothing heavy: the device side imports ``forgekit.devices.runner`` with only
the runtime's files present.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Sequence


@dataclass
class DeviceRun:
    """What one run on a device returned."""

    outputs: list[Any]
    #: milliseconds: loading the artifact, and each timed inference (one entry without timing)
    load_ms: float = 0.0
    infer_ms: list[float] = field(default_factory=list)
    #: wall seconds of the whole run (process start, emulation, transfers included)
    seconds: float = 0.0
    #: where it ran, for reports (e.g. "aarch64 via qemu", "key 'pi5' at tracker h:9190")
    where: str = ""
    #: the instruction-set level the device's CPU loaded (portable artifacts; None otherwise)
    level: str | None = None


class Device(Protocol):
    """Something that can run a staged artifact directory on inputs."""

    #: short name for messages: "native", "qemu-aarch64", "rpc"
    name: str

    def run(self, artifact: Path, inputs: Sequence[Any], *, runs: int = 0, warmup: int = 0,
            timeout: float = 1800) -> DeviceRun:
        """Load ``artifact`` (a plaintext staged copy) and run it on ``inputs``; with ``runs`` > 0 also time
        that many inferences after ``warmup`` untimed ones.  Raises a one-line ForgekitError."""
