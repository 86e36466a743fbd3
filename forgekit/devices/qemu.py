"""An architecture this machine can emulate: the artifact runs under qemu user-mode emulation in the cached
Debian rootfs (:mod:`.rootfs`), through the same runner and runtime as on a device."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import VerificationError
from . import DeviceRun
from .rootfs import ensure_rootfs, guest, run_in_rootfs
from .runner import GUEST_FILES
from .staging import collect, save_inputs


class QemuDevice:
    """Runs artifacts of ``arch`` (``aarch64``) under qemu in a chroot; the rootfs is built on first use."""

    def __init__(self, arch: str, log: Callable[[str], None] | None = None) -> None:
        self.guest = guest(arch)  # one line when the architecture cannot be emulated
        self.arch = arch
        self.name = f"qemu-{arch}"
        self.log = log

    def run(self, artifact: Path, inputs: Sequence[Any], *, runs: int = 0, warmup: int = 0,
            timeout: float = 1800) -> DeviceRun:
        root = ensure_rootfs(self.arch, log=self.log)
        guest_dir = Path(tempfile.mkdtemp(prefix="forgekit-run-", dir=root / "tmp"))
        try:
            copy_package(guest_dir / "pkg" / "forgekit")
            shutil.copytree(artifact, guest_dir / "artifact")
            save_inputs(guest_dir / "inputs.npz", inputs)
            inside = "/" + str(guest_dir.relative_to(root))
            start = time.perf_counter()
            try:
                proc = run_in_rootfs(root, self.guest, ["/usr/bin/python3", "-m", "forgekit.devices.runner",
                                                        f"{inside}/artifact", f"{inside}/inputs.npz",
                                                        f"{inside}/outputs.npz", str(runs), str(warmup)],
                                     timeout=timeout, env={"PYTHONPATH": f"{inside}/pkg"})
            except subprocess.TimeoutExpired:
                raise VerificationError(f"The artifact did not finish within {timeout:.0f} s under qemu.") from None
            seconds = time.perf_counter() - start
            outputs, timing = collect(proc, guest_dir / "outputs.npz", self.name)
        finally:
            shutil.rmtree(guest_dir, ignore_errors=True)
        return DeviceRun(outputs, timing["load_ms"], timing["infer_ms"], seconds, f"{self.arch} via qemu",
                         timing.get("level"))


def copy_package(dest: Path) -> None:
    """forgekit's runtime files (:data:`~forgekit.devices.runner.GUEST_FILES`) into ``dest``."""
    package = Path(__file__).resolve().parents[1]
    for pattern in GUEST_FILES:
        for src in package.glob(pattern):
            target = dest / src.relative_to(package)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
