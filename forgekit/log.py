"""What reaches the user's terminal: forgekit's own lines, never TVM's noise unless asked for.

TVM's C++ code writes its warnings straight to file descriptor 2 ("Fast mode segfaults...", "BlockBuilder
destroyed with remaining blocks!", "using default -mcpu=generic"), and the ONNX version converter raises
``UserWarning`` s with source lines.  None of it is actionable for a user, and it buries the one line
that is.  :func:`quiet_native` redirects the process's stdout/stderr *file descriptors* to a scratch file
around a noisy stage (and silences Python warnings), unless the verbosity is ``verbose`` or higher
(``--verbose``/``--debug``, or ``FORGEKIT_VERBOSE=1``).  forgekit's own status lines and progress bars
go to a duplicate of the original stderr (:func:`terminal`), so they still show during such a stage.

On GitHub Actions (``GITHUB_ACTIONS=true``) :func:`error` also emits an ``::error::`` annotation and
:func:`group` folds a stage's output.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import sys
import tempfile
import threading
import traceback
import warnings
from typing import IO, Iterator

QUIET, NORMAL, VERBOSE, DEBUG = 0, 1, 2, 3
_state = {"level": VERBOSE if os.environ.get("FORGEKIT_VERBOSE") else NORMAL, "depth": 0}
_lock = threading.RLock()
_terminal: dict[str, IO[str]] = {}
#: what the last quiet stage captured (for --debug reports and tests)
captured: dict[str, str] = {}


def set_verbosity(level: int) -> None:
    """QUIET (errors only), NORMAL (default), VERBOSE (TVM's own output too) or DEBUG (and tracebacks)."""
    _state["level"] = level


def verbosity() -> int:
    return _state["level"]


def terminal() -> IO[str]:
    """A text stream to the terminal's stderr that keeps working while :func:`quiet_native` redirects fd 2."""
    with _lock:
        if "err" not in _terminal:
            try:
                _terminal["err"] = os.fdopen(os.dup(sys.stderr.fileno()), "w", buffering=1, encoding="utf-8",
                                             errors="replace", closefd=True)
            except (OSError, ValueError, AttributeError, io.UnsupportedOperation):  # no real fd (pytest capture)
                return sys.stderr
        return _terminal["err"]


def first_line(exc: BaseException | str) -> str:
    """The first non-empty line of an error message (TVM's come with a C++ backtrace)."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    return lines[0] if lines else (type(exc).__name__ if isinstance(exc, BaseException) else "")


def last_line(text: str) -> str:
    """The last non-empty line of a tool's output (where compilers and runners put the error)."""
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def in_github_actions() -> bool:
    return os.environ.get("GITHUB_ACTIONS") == "true"


def status(message: str) -> None:
    """A progress/status line on stderr (not in QUIET mode)."""
    if verbosity() >= NORMAL:
        print(message, file=terminal())


def warn(message: str) -> None:
    """A warning line on stderr (also a ``::warning::`` annotation on GitHub Actions)."""
    if in_github_actions():
        print(f"::warning::forgekit: {message}", file=terminal())
    print(f"warning: {message}", file=terminal())


def error(message: str) -> None:
    """The one error line (and a ``::error::`` annotation on GitHub Actions)."""
    if in_github_actions():
        print(f"::error::forgekit: {message}", file=terminal())
    print(f"error: {message}", file=terminal())


@contextlib.contextmanager
def group(title: str) -> Iterator[None]:
    """A foldable group on GitHub Actions; nothing elsewhere."""
    if not in_github_actions():
        yield
        return
    print(f"::group::{title}", file=terminal())
    try:
        yield
    finally:
        print("::endgroup::", file=terminal())


def _drop_suppressed(error: BaseException) -> None:
    """Release the tracebacks of the errors ``error`` was raised to replace (``from None``): never shown."""
    seen = 0
    while error is not None and seen < 16:
        context = error.__context__
        if context is not None and error.__suppress_context__:
            context.__traceback__ = None
            error.__context__ = None
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
        seen += 1


@contextlib.contextmanager
def quiet_native(stage: str) -> Iterator[None]:
    """Keep TVM's C++ log lines and Python warnings of ``stage`` off the terminal (unless verbose).

    Nested uses redirect once.  What was captured is kept in ``captured[stage]``.
    """
    if verbosity() >= VERBOSE:
        yield
        return
    with _lock:
        outer = _state["depth"] > 0
        _state["depth"] += 1
    if outer:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                yield
        finally:
            with _lock:
                _state["depth"] -= 1
        return
    terminal()  # duplicate the real stderr before it is redirected
    saved: list[tuple[int, int]] = []
    sink = tempfile.TemporaryFile(mode="w+b")
    try:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, ValueError, io.UnsupportedOperation):
                stream.flush()
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                saved.append((fd, os.dup(fd)))
                os.dup2(sink.fileno(), fd)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                yield
            except BaseException as error:
                # a failed stage leaves TVM objects (a BlockBuilder with open blocks...) whose destructors
                # log; let them die while the output is still redirected.  They live in the frames of the
                # original error that a one-line error replaced ("raise ... from None"): drop those first.
                _drop_suppressed(error)
                if "KeyboardInterrupt" in type(error).__name__:  # or the TVM error carrying one
                    # Ctrl-C: the interrupt's own traceback holds the frames it cut short (the ONNX importer's,
                    # with its BlockBuilder), alive until the CLI has printed its line and stderr is back.
                    # No traceback of an interrupt is ever shown, so their locals are let go here (CI: "error:
                    # interrupted" followed by "BlockBuilder destroyed with remaining blocks!").
                    traceback.clear_frames(error.__traceback__)
                gc.collect()
                raise
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, ValueError, io.UnsupportedOperation):
                stream.flush()
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)
        sink.seek(0)
        captured[stage] = sink.read().decode("utf-8", errors="replace")
        sink.close()
        with _lock:
            _state["depth"] -= 1
