"""Tuning measurements on a board over TVM RPC: forgekit's tuner (:mod:`forgekit.tuning.tuner`) with a remote
``measure`` backend.

Why not MetaSchedule's ``RPCRunner``?  It runs MetaSchedule's builder/runner pipeline (pools of worker
processes that each import TVM, artifacts handed over by path) around MetaSchedule's own search, which
forgekit does not use (see :mod:`forgekit.tuning`).  forgekit's tuner measures one candidate at a time,
so one RPC session is opened for the whole run and each candidate is cross-built here, linked with the
target's linker (``aarch64-linux-gnu-g++`` for a Raspberry Pi), uploaded, loaded and timed on the board
with the remote ``time_evaluator`` — TVM's RPC protocol end to end, and the board only needs TVM's stock
RPC server.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable

from ..devices.rpc import RpcConfig, check_arch, connect, first_line, load_library
from ..errors import RPCError


class RemoteMeasure:
    """``measure`` for :func:`forgekit.tuning.tuner.tune` that times candidates on an RPC device.

    Parameters
    ----------
    config:
        Where the board is (tracker and key, or one server).
    arch:
        The target's CPU architecture: the device must have it.
    fcompile:
        The target family's linker for ``export_library`` (``None``: the host compiler).
    """

    def __init__(self, config: RpcConfig, arch: str, fcompile: Callable[..., Any] | None) -> None:
        self.config = config
        self.fcompile = fcompile
        self.session = connect(config)
        self.remote_arch = check_arch(self.session, arch, f"the {arch} target being tuned", config)
        self.dev = self.session.cpu(0)
        self._tmp = tempfile.TemporaryDirectory(prefix="forgekit-rpc-tune-")
        self._count = 0

    def __call__(self, task: Any, knobs: dict[str, Any], target: Any, number: int, repeat: int) -> list[float]:
        import tvm

        from ..backends.cpu import stack_tiles
        from .tasks import random_args, schedule_candidate

        mod = schedule_candidate(task, knobs, target)
        lib = tvm.compile(mod, target=target, tir_pipeline=stack_tiles.tir_pipeline())
        self._count += 1
        path = Path(self._tmp.name) / f"candidate{self._count}.so"
        if self.fcompile is None:
            lib.export_library(str(path))
        else:
            lib.export_library(str(path), fcompile=self.fcompile)
        remote = load_library(self.session, path, self.config)
        path.unlink()
        try:
            args = [tvm.runtime.tensor(a, self.dev) for a in random_args(mod)]
            timer = remote.time_evaluator("main", self.dev, number=number, repeat=repeat, min_repeat_ms=20)
            return [float(r) for r in timer(*args).results]
        except Exception as exc:
            if _lost(exc):
                raise RPCError(f"Lost the RPC device ({self.config.describe()}) while tuning: {first_line(exc)}") from None
            raise

    def close(self) -> None:
        """Drop the session (the server then deletes what was uploaded) and the local build folder."""
        import gc

        self.session = self.dev = None
        gc.collect()  # a board serves one session at a time: free it now, not whenever a cycle is collected
        self._tmp.cleanup()

    def __enter__(self) -> RemoteMeasure:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _lost(exc: BaseException) -> bool:
    """Whether an exception means the connection is gone (not just an invalid candidate)."""
    text = str(exc)
    return any(s in text for s in ("RPCSessionTimeoutError", "Socket", "socket", "connection", "Connection"))
