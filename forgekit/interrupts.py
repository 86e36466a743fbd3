"""Ctrl-C during a long TVM call stays a Ctrl-C.

Python delivers SIGINT as KeyboardInterrupt, but when it lands while TVM's C++ code is running, TVM's FFI
hands it back as its own error (a ``RuntimeError`` with no message), which a stage would then report as "TVM
failed to compile", exit 6, and a fallback around a TVM call may even carry on and finish (exit 0).
:func:`watch` records that SIGINT arrived; :func:`check` turns any error raised after it into the
KeyboardInterrupt it was, and a block that ends after one, returning or raising, ends in KeyboardInterrupt.
Every CLI verb runs inside one watch, so a stage that wraps TVM's errors in its own one-line error needs no
care of its own (exit 130).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator

_state = {"interrupted": False, "depth": 0}


def _handler(signum: int, frame: Any) -> None:
    _state["interrupted"] = True
    raise KeyboardInterrupt


def interrupted() -> bool:
    """Whether SIGINT arrived inside the watch now running (False outside any)."""
    return bool(_state["depth"] and _state["interrupted"])


@contextlib.contextmanager
def watch() -> Iterator[None]:
    """Record SIGINT within the block (main thread only; elsewhere signals cannot be handled anyway).  Once one
    arrived, the block ends in KeyboardInterrupt whatever it raised or returned; the record ends with the
    outermost block, so an interrupt handled by the caller is not held against a later call."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        # SIG_IGN: started with Ctrl-C ignored (nohup, a background job of a script), which stays so
        yield
        return
    outermost = _state["depth"] == 0
    if outermost:  # an inner block must not forget an interrupt an outer one already saw
        _state["interrupted"] = False
    previous = signal.signal(signal.SIGINT, _handler)
    _state["depth"] += 1
    try:
        yield
    except KeyboardInterrupt:
        raise
    except BaseException:
        if _state["interrupted"]:  # a stage reported the interrupted TVM call as its own failure
            raise KeyboardInterrupt from None
        raise
    else:
        if _state["interrupted"]:
            # the KeyboardInterrupt was raised inside a callback that TVM (or a fallback around a TVM call)
            # caught and carried on from: the block finished, but the user asked to stop.
            raise KeyboardInterrupt
    finally:
        _state["depth"] -= 1
        signal.signal(signal.SIGINT, previous)
        if outermost:
            _state["interrupted"] = False


def check(exc: BaseException) -> None:
    """Raise KeyboardInterrupt when ``exc`` is what an interrupted TVM call turned into."""
    if (_state["depth"] and _state["interrupted"]) or isinstance(exc, KeyboardInterrupt) \
            or "KeyboardInterrupt" in type(exc).__name__:
        raise KeyboardInterrupt from None
