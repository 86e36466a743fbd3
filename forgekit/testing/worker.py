"""The child process of :func:`forgekit.testing.differential.check`: import, compile and run one model per
job, reused across jobs; a crash (segfault in TVM) or a hang costs the child, never the caller.

Started with ``subprocess`` (not ``multiprocessing``: no re-import of the caller's ``__main__``), talking
over a pipe pair; a job is a dict (model bytes, feeds, levels, target, quantize, calibration feeds), answers
are tuples (``start``, ``outputs``, ``compile-error``, ``runtime-error``, ``crash``, ``timeout``, ...).
"""

from __future__ import annotations

import signal
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import onnx


def _signal_name(code: int | None) -> str:
    if code is None:
        return "unknown"
    if code < 0:
        return signal.Signals(-code).name if -code in signal.valid_signals() else f"signal{-code}"
    return f"exit{code}"


# ---------------------------------------------------------------------------------------------- child side
def _exc_info(exc: BaseException) -> dict[str, Any]:
    return {"type": type(exc).__name__, "message": str(exc), "ops": [op for op, _ in getattr(exc, "ops", [])],
            "op_type": getattr(exc, "op_type", None), "traceback": traceback.format_exc()[-4000:]}


def _child_job(conn: Any, job: dict[str, Any]) -> None:
    import forgekit as forge

    if job.get("selftest") == "segv":  # tests/unit/test_fuzz.py: a crash must come back as crash:SIGSEGV
        import os

        conn.send(("start", 0))
        os.kill(os.getpid(), signal.SIGSEGV)

    try:
        ir = forge.from_onnx(onnx.load_from_string(job["model"]))
    except Exception as exc:
        conn.send(("import-error", _exc_info(exc)))
        return
    names = ir.input_names
    if job["quantize"]:
        try:
            ir.calibrate([tuple(feed[n] for n in names) for feed in job["calib"]])
            ir.quantize(per_channel=True, calib_method="percentile")
        except Exception as exc:
            conn.send(("quantize-error", _exc_info(exc)))
            return
    conn.send(("imported", names))
    for level in job["levels"]:
        conn.send(("start", level))
        start = time.perf_counter()
        try:
            fn = ir.get_inference_function(target=job["target"], opt_level=level)
        except Exception as exc:
            conn.send(("compile-error", level, _exc_info(exc), time.perf_counter() - start))
            continue
        seconds = time.perf_counter() - start
        try:
            outs = []
            for feed in job["feeds"]:
                res = fn(*[feed[n] for n in names])
                outs.append([np.asarray(res)] if not isinstance(res, list) else [np.asarray(r) for r in res])
        except Exception as exc:
            conn.send(("runtime-error", level, _exc_info(exc), seconds))
            continue
        conn.send(("outputs", level, outs, seconds))


def _child_entry(read_fd: int, write_fd: int) -> None:
    """Body of the worker process (``python -c``): serve jobs until the parent closes the pipe."""
    from multiprocessing.connection import Connection

    inbox, outbox = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    while True:
        try:
            job = inbox.recv()
        except EOFError:
            return
        if job is None:
            return
        try:
            _child_job(outbox, job)
        except Exception as exc:  # a bug in this harness: report it, keep serving
            outbox.send(("harness-error", _exc_info(exc)))
        outbox.send(("done",))


class Worker:
    """A child process that imports, compiles and runs models; restarted after a crash or a hang.

    Started with ``subprocess`` (not ``multiprocessing``: no re-import of the caller's ``__main__``);
    jobs and answers travel pickled over two pipes, the child's stderr goes to a temporary file whose
    tail is quoted when it dies.
    """

    def __init__(self, recycle_after: int = 150) -> None:
        self._proc: Any = None
        self._inbox: Any = None
        self._outbox: Any = None
        self._log: Any = None
        self._jobs = 0
        self.recycle_after = recycle_after

    def _start(self) -> None:
        import os
        import subprocess
        import sys
        import tempfile
        from multiprocessing.connection import Connection

        job_r, job_w = os.pipe()
        ans_r, ans_w = os.pipe()
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]))
        self._log = tempfile.TemporaryFile()
        code = f"from forgekit.testing.worker import _child_entry; _child_entry({job_r}, {ans_w})"
        self._proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(job_r, ans_w), env=env,
                                      stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log)
        os.close(job_r)
        os.close(ans_w)
        self._outbox, self._inbox = Connection(job_w, readable=False), Connection(ans_r, writable=False)
        self._jobs = 0

    def _log_tail(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        lines = [ln for ln in self._log.read().decode(errors="replace").splitlines() if ln.strip()]
        return "\n".join(lines[-15:])

    def close(self) -> None:
        if self._proc is not None:
            try:
                self._outbox.send(None)
                self._proc.wait(5)
            except Exception:
                pass
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()
            for conn in (self._inbox, self._outbox):
                conn.close()
            self._log.close()
        self._proc = self._inbox = self._outbox = self._log = None

    def run(self, job: dict[str, Any], timeout: float) -> list[tuple]:
        """Messages for ``job``; ends with ``("done",)``, ``("crash", signal, level, log)`` or
        ``("timeout", level)``."""
        if self._proc is None or self._proc.poll() is not None or self._jobs >= self.recycle_after:
            self.close()
            self._start()
        self._jobs += 1
        messages: list[tuple] = []
        level = None
        try:
            self._outbox.send(job)
        except OSError:
            pass  # the child died at start-up: reported below
        while True:
            try:
                ready = self._inbox.poll(timeout)
                msg = self._inbox.recv() if ready else None
            except (EOFError, OSError):
                ready, msg = True, None
            if not ready:
                self._proc.kill()
                self.close()
                return messages + [("timeout", level)]
            if msg is None:
                try:
                    code = self._proc.wait(10)
                except Exception:
                    self._proc.kill()
                    code = self._proc.wait()
                tail = self._log_tail()
                self.close()
                return messages + [("crash", _signal_name(code), level, tail)]
            if msg[0] == "start":
                level = msg[1]
            messages.append(msg)
            if msg[0] == "done":
                return messages


_SHARED: Worker | None = None


def shared_worker() -> Worker:
    global _SHARED
    if _SHARED is None:
        import atexit

        _SHARED = Worker()
        atexit.register(_SHARED.close)
    return _SHARED
