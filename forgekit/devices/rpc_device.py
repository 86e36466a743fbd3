"""A board over TVM RPC (see :mod:`.rpc`): the library is uploaded and loaded there, the Relax VM built over
the remote CPU, and the remote ``time_evaluator`` times ``invoke_stateful`` on the board itself, so the
network round trip is not in the numbers."""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..artifact.layout import LIBRARY_FILE, read_metadata, shared_weights_file
from ..errors import RPCError
from . import DeviceRun
from .rpc import RpcConfig, check_arch, connect, first_line, load_library


def _flatten(value: Any) -> list[Any]:
    """Remote VM outputs (a tensor or nested tuples of them) as a flat list."""
    if hasattr(value, "numpy"):
        return [value]
    out: list[Any] = []
    for item in value:
        out.extend(_flatten(item))
    return out


class RpcDevice:
    """The board of ``config`` (a tracker and key, or one server)."""

    name = "rpc"

    def __init__(self, config: RpcConfig) -> None:
        self.config = config

    def run(self, artifact: Path, inputs: Sequence[Any], *, runs: int = 0, warmup: int = 0,
            timeout: float = 1800) -> DeviceRun:
        meta = read_metadata(artifact)
        arch = meta.get("build", {}).get("arch", "")
        shared = shared_weights_file(meta)
        start = time.perf_counter()
        failure, (remote, outputs, seconds) = self._session(artifact / LIBRARY_FILE, arch, str(artifact),
                                                            list(inputs), runs, warmup,
                                                            artifact / shared if shared else None)
        # The board serves one session at a time: the session must be gone before anything else asks for it.
        # Every remote handle lived in _session's frame (not in a traceback kept by the raise below); the
        # collection frees any cycle that still holds one.
        gc.collect()
        if failure is not None:
            raise failure
        return DeviceRun(outputs, 0.0, [s * 1e3 for s in seconds], time.perf_counter() - start,
                         f"{self.config.describe()} ({remote or 'unknown arch'})")

    def _session(self, library: Path, arch: str, what: str, inputs: list[np.ndarray], runs: int,
                 warmup: int, shared: Path | None = None) -> tuple[Exception | None, tuple[Any, Any, Any]]:
        """Connect, load, run and time on the device: (error or None, (remote arch, outputs, run seconds)).
        Errors are returned, not raised, so no traceback keeps the session alive after this returns."""
        import tvm
        from tvm.runtime.vm import VirtualMachine

        config = self.config
        session = module = vm = args = timer = dev = None
        try:
            session = connect(config)
            remote = check_arch(session, arch, f"'{what}'", config)
            module = load_library(session, library, config, shared)
            dev = session.cpu(0)
            vm = VirtualMachine(module, dev)
            args = [tvm.runtime.tensor(a, dev) for a in inputs]
            vm.set_input("main", *args)
            for _ in range(max(warmup, 1)):  # at least once: the outputs are read from this run
                vm.invoke_stateful("main")
            outputs = [o.numpy() for o in _flatten(vm.get_outputs("main"))]
            seconds: list[float] = []
            if runs:
                # number=1: one sample per run, like the local bench (time_evaluator adds one untimed call)
                timer = vm.time_evaluator("invoke_stateful", dev, number=1, repeat=runs)
                seconds = [float(s) for s in timer("main").results]
            return None, (remote, outputs, seconds)
        except RPCError as exc:
            return RPCError(str(exc)), (None, None, None)
        except Exception as exc:
            return (RPCError(f"Running '{what}' on the RPC device ({config.describe()}) failed: {first_line(exc)}"),
                    (None, None, None))
        finally:
            session = module = vm = args = timer = dev = None
