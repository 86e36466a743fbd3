"""The ``forgekit`` command line: one module per verb group, each a thin adapter over the library.

:mod:`.app` (the typer app, shared ``--verbose``/``--quiet``/``--debug``, errors -> exit codes),
:mod:`.options` (option types and parsing shared by verbs), and the verbs: :mod:`.inspect`,
:mod:`.compile` (``compile``, ``quantize-report``), :mod:`.run`, :mod:`.crypto` (``encrypt``, ``decrypt``,
``rekey``), :mod:`.evaluate` (``bench``, ``verify``), :mod:`.release` (``publish``, ``targets``),
:mod:`.images` (``images``), :mod:`.runtime` (``runtime build``).  A new verb is one module imported here.
"""

from __future__ import annotations

try:
    from . import compile, crypto, evaluate, images, inspect, release, run, runtime  # noqa: F401 - registers the verbs
    from .app import app
except KeyboardInterrupt:  # Ctrl-C while the verbs import (a second or more on a loaded machine): no traceback
    import sys

    print("error: interrupted", file=sys.stderr)
    raise SystemExit(130) from None


def main() -> None:
    """Console-script entry point."""
    app()


__all__ = ["app", "main"]
