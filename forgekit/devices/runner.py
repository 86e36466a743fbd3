"""The device side of ``forgekit verify`` (and of timing on a device): run an artifact on the inputs of an
``.npz`` file and save its outputs.

``python3 -m forgekit.devices.runner ARTIFACT INPUTS.npz OUTPUTS.npz [RUNS [WARMUP]]`` runs on the host
for native artifacts and in the qemu chroot for cross-built ones, where only the runtime's files of
forgekit are present (:data:`GUEST_FILES`): so it imports nothing else from forgekit, and the artifact is
loaded by the very :class:`~forgekit.runtime.Engine` users deploy.  A user error exits with its forgekit
exit code and its message as the last line of stderr; timings go to stdout as one JSON line.
"""

from __future__ import annotations

import json
import sys
import time

#: the forgekit files a device needs to run this program (relative to the package folder)
GUEST_FILES = ("__init__.py", "errors.py", "artifact/__init__.py", "artifact/layout.py", "runtime/*.py",
               "crypto/*.py", "devices/__init__.py", "devices/runner.py")


def main(argv: list[str]) -> int:
    """Entry point; returns the process exit status."""
    # tvm_ffi imports torch whenever it is installed; a deployed runtime has none, and it costs seconds.
    sys.modules.setdefault("torch", None)  # type: ignore[arg-type]
    import numpy as np

    from forgekit.errors import ForgekitError
    from forgekit.runtime import Engine

    artifact, inputs_path, outputs_path = argv[:3]
    runs = int(argv[3]) if len(argv) > 3 else 0
    warmup = int(argv[4]) if len(argv) > 4 else 0
    try:
        start = time.perf_counter()
        engine = Engine(artifact)
        loaded = time.perf_counter()
        with np.load(inputs_path) as data:
            feeds = [data[f"arg{i}"] for i in range(len(data.files))]
        outputs = engine.infer(*feeds)
        done = time.perf_counter()
        times = engine.time_runs(runs, warmup, feeds) if runs else [(done - loaded) * 1e3]
    except ForgekitError as exc:
        print(str(exc), file=sys.stderr)
        return exc.exit_code
    np.savez(outputs_path, **{f"out{i}": array for i, array in enumerate(outputs)})
    print(json.dumps({"load_ms": (loaded - start) * 1e3, "infer_ms": times, "level": engine.level}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
