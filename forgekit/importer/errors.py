"""Errors raised by the importer, rooted in forgekit's error hierarchy.

Every class derives from :class:`ImportErrorBase`, itself a :class:`forgekit.errors.ModelLoadError`,
so the CLI prints the message as one line and exits with a stable code:

=============================  ====  ===================================================
class                          exit  meaning
=============================  ====  ===================================================
:class:`PrepareError`           3    the model (or an argument about it) cannot be prepared
:class:`DynamicShapeError`      3    input dimensions must be pinned before import
:class:`UnsupportedOperatorsError`  4  operators nothing can convert (all listed at once)
:class:`ConversionError`        4    a converter failed on one node (named in the message)
:class:`DynamicDimensionError`  3    the node converts at fixed sizes, not with its dimensions dynamic
=============================  ====  ===================================================

Each message is one line that says what is wrong and what to do about it.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ModelLoadError, UnsupportedOperatorError

#: hint appended to conversion failures when nothing more specific applies
REPORT_HINT = "re-export the model without it (or with static input shapes) or open an issue with the model"


class ImportErrorBase(ModelLoadError):
    """Root of every error the importer raises on purpose (a :class:`ModelLoadError`, exit code 3)."""


class DynamicShapeError(ImportErrorBase):
    """The model has dynamic input dimensions that were not pinned.

    ``inputs`` is a list of ``(input_name, shape)`` where ``shape`` holds ints for static dims and
    strings (the ``dim_param`` or ``"?"``) for dynamic ones (``None``: unknown rank).
    """

    exit_code = 3

    def __init__(self, inputs: Sequence[tuple[str, list | None]], hint: str = ""):
        self.inputs = list(inputs)
        self.hint = hint
        listing = ", ".join(f"{n}{fmt_shape(s)}" for n, s in self.inputs)
        msg = f"The model has dynamic input dimensions that must be pinned: {listing}"
        if hint:
            msg += f"; {hint}"
        super().__init__(_single_line(msg))


class UnsupportedOperatorsError(ImportErrorBase, UnsupportedOperatorError):
    """One or more operators cannot be imported (exit code 4).

    ``ops`` is the full list of ``(op_type, node_name)`` in graph order; ops of a non-default domain
    are spelled ``domain.OpType`` (e.g. ``com.microsoft.FusedConv``).
    """

    exit_code = 4

    def __init__(self, ops: Sequence[tuple[str, str]], where: str | None = None):
        self.ops = [(str(op), str(name)) for op, name in ops]
        by_type: dict[str, list[str]] = {}
        for op, name in self.ops:
            by_type.setdefault(op, []).append(name)
        parts = []
        for op, names in by_type.items():
            shown = ", ".join(names[:5]) + (f", ... (+{len(names) - 5})" if len(names) > 5 else "")
            parts.append(f"{op} ({shown})")
        super().__init__(_single_line(
            f"{where or 'The model'} uses {len(by_type)} unsupported operator type(s): {'; '.join(parts)}. "
            "Replace them in the exporter or open an issue with the model."
        ))


class ConversionError(ImportErrorBase, UnsupportedOperatorError):
    """The TVM Relax frontend (or one of the importer's converters) failed on one node (exit code 4).

    ``op_type`` and ``node_name`` name the node when known; ``detail`` is the one-line cause.
    """

    exit_code = 4

    def __init__(self, op_type: str | None, node_name: str | None, detail: str, hint: str = REPORT_HINT,
                 where: str | None = None):
        self.op_type = op_type
        self.node_name = node_name
        self.detail = detail
        self.hint = hint
        if op_type:
            node = f"{op_type} node '{node_name}'" if node_name else f"a {op_type} node"
            what = f"{node} of {where}" if where else node
        else:
            what = where or "the model"
        super().__init__(_single_line(f"Could not import {what}: {str(detail).rstrip('.')}; {hint}."))

    def with_context(self, where: str | None = None, hint: str | None = None) -> ConversionError:
        """The same failure, re-worded for ``where`` (e.g. the file) and with another hint."""
        return ConversionError(self.op_type, self.node_name, self.detail, hint or self.hint, where)


class DynamicDimensionError(ConversionError):
    """A node that converts once some input dimensions are pinned but not with them dynamic (exit code 3,
    as :class:`DynamicShapeError`): every operator is supported, so exit 4 ("unsupported operators") would
    send the user to the exporter for nothing.  The hint names the fix that was checked by importing."""

    exit_code = 3

    def with_context(self, where: str | None = None, hint: str | None = None) -> DynamicDimensionError:
        return DynamicDimensionError(self.op_type, self.node_name, self.detail, hint or self.hint, where)


class PrepareError(ImportErrorBase):
    """The ONNX model could not be prepared (invalid model, bad ``shape_dict``/``freeze``...; exit code 3)."""

    exit_code = 3

    def __init__(self, message: str):
        super().__init__(_single_line(message))


def fmt_shape(shape: Sequence | None) -> str:
    """``[1, N, 4]``; ``[unknown rank]`` for None."""
    if shape is None:
        return "[unknown rank]"
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _single_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def one_line(exc: BaseException, limit: int = 300) -> str:
    """First meaningful line of an exception message (TVM messages carry tracebacks)."""
    text = str(exc).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # TVM errors look like "Traceback ...\n  File ...\nValueError: message" or
    # put the message first; prefer the last line that looks like 'XError: msg'.
    pick = None
    for ln in lines:
        if ln.startswith(("File ", "Traceback", "at ", "^")) or ln.startswith("  "):
            continue
        pick = ln
    if pick is None:
        pick = lines[-1] if lines else type(exc).__name__
    pick = f"{type(exc).__name__}: {pick}" if not pick.startswith(type(exc).__name__) else pick
    return pick if len(pick) <= limit else pick[: limit - 3] + "..."
