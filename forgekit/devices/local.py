"""This machine, in a child process: a crash (an illegal instruction, a bad library) becomes a failed run
instead of taking the caller down."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from ..errors import VerificationError
from . import DeviceRun
from .staging import collect, save_inputs


class LocalDevice:
    """Runs artifacts of this machine's architecture with this Python."""

    name = "native"

    def run(self, artifact: Path, inputs: Sequence[Any], *, runs: int = 0, warmup: int = 0,
            timeout: float = 1800) -> DeviceRun:
        package_parent = str(Path(__file__).resolve().parents[2])
        env = {**os.environ,
               "PYTHONPATH": os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")]))}
        with tempfile.TemporaryDirectory(prefix="forgekit-run-") as scratch:
            work = Path(scratch)
            save_inputs(work / "inputs.npz", inputs)
            start = time.perf_counter()
            try:
                proc = subprocess.run([sys.executable, "-m", "forgekit.devices.runner", str(artifact),
                                       str(work / "inputs.npz"), str(work / "outputs.npz"), str(runs), str(warmup)],
                                      capture_output=True, text=True, timeout=timeout, env=env, check=False)
            except subprocess.TimeoutExpired:
                raise VerificationError(f"The artifact did not finish within {timeout:.0f} s.") from None
            seconds = time.perf_counter() - start
            outputs, timing = collect(proc, work / "outputs.npz", self.name)
        return DeviceRun(outputs, timing["load_ms"], timing["infer_ms"], seconds, "this machine", timing.get("level"))
