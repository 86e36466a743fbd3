"""Stage reports from long steps, for whoever listens: the CLI's spinner on a terminal, stage lines in a
CI log (``forgekit compile``).  Stages call :func:`report`; nothing is shown unless a caller listens.

A compile of a large model spends minutes in TVM (graph passes, scheduling hundreds of kernels, LLVM
codegen per CPU level, linking) with nothing to show for it but TVM's own log noise, which
:mod:`forgekit.log` hides: these reports say where it is.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Callable, Iterator

#: receives (stage, done, total); done/total are None for a stage without a count
Listener = Callable[[str, "int | None", "int | None"], None]
_LISTENER: ContextVar[Listener | None] = ContextVar("forgekit_progress", default=None)


def report(stage: str, done: int | None = None, total: int | None = None) -> None:
    """Tell the listener (if any) that ``stage`` is under way (``done`` of ``total`` items)."""
    listener = _LISTENER.get()
    if listener is not None:
        listener(stage, done, total)


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Within the block, :func:`report` calls ``listener``."""
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)


def describe(stage: str, done: int | None, total: int | None) -> str:
    return f"{stage} {done}/{total}" if done is not None and total else stage
