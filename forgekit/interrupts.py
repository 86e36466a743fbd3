"""Ctrl-C during a long TVM call stays a Ctrl-C.

Python delivers SIGINT as KeyboardInterrupt, but when it lands while TVM's C++ code is running, TVM's FFI
hands it back as its own error (a ``RuntimeError`` with no message), which a stage would then report as "TVM
failed to compile", exit 6.  :func:`watch` records that SIGINT arrived; :func:`check` turns any error
raised after it into the KeyboardInterrupt it was (the CLI exits 130).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator

_state = {"interrupted": False}


def _handler(signum: int, frame: Any) -> None:
    _state["interrupted"] = True
    raise KeyboardInterrupt


@contextlib.contextmanager
def watch() -> Iterator[None]:
    """Record SIGINT within the block (main thread only; elsewhere signals cannot be handled anyway)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _state["interrupted"] = False
    previous = signal.signal(signal.SIGINT, _handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def check(exc: BaseException) -> None:
    """Raise KeyboardInterrupt when ``exc`` is what an interrupted TVM call turned into."""
    if _state["interrupted"] or isinstance(exc, KeyboardInterrupt) or "KeyboardInterrupt" in type(exc).__name__:
        raise KeyboardInterrupt from None
