"""Run an artifact on the inputs of an ``.npz`` file and save its outputs: the device side of ``forgekit verify``.

It runs as ``python3 -m forgekit._verify_runner ARTIFACT INPUTS.npz OUTPUTS.npz``, on the host for native
artifacts and in the qemu chroot for cross-built ones, where only this file, ``forgekit/__init__.py``,
``errors.py``, ``runtime.py`` and ``crypto/`` are present: so it imports nothing else from forgekit, and
the artifact is loaded by the very :class:`~forgekit.runtime.Engine` users deploy.  A user error
exits with its forgekit exit code and its message as the last line of stderr; timings go to stdout as JSON.
"""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> int:
    """Entry point; returns the process exit status."""
    # tvm_ffi imports torch whenever it is installed; a deployed runtime has none, and it costs seconds.
    sys.modules.setdefault("torch", None)  # type: ignore[arg-type]
    import numpy as np

    from forgekit.errors import ForgekitError
    from forgekit.runtime import Engine

    artifact, inputs_path, outputs_path = argv
    try:
        start = time.perf_counter()
        engine = Engine(artifact)
        loaded = time.perf_counter()
        with np.load(inputs_path) as data:
            feeds = [data[f"arg{i}"] for i in range(len(data.files))]
        outputs = engine.infer(*feeds)
        done = time.perf_counter()
    except ForgekitError as exc:
        print(str(exc), file=sys.stderr)
        return exc.exit_code
    np.savez(outputs_path, **{f"out{i}": array for i, array in enumerate(outputs)})
    print(json.dumps({"load_ms": (loaded - start) * 1e3, "infer_ms": (done - loaded) * 1e3}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
