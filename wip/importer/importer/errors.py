"""Errors raised by the importer.

All of them derive from :class:`ImportErrorBase`; when the package moves into
forgekit, re-point ``ImportErrorBase`` at forgekit's error root
(``UnsupportedOperatorError``, exit code 4) and nothing else needs to change.
"""

from __future__ import annotations


class ImportErrorBase(Exception):
    """Root of every error this package raises on purpose."""


class DynamicShapeError(ImportErrorBase):
    """The model has dynamic input dimensions that were not pinned.

    ``inputs`` is a list of ``(input_name, shape)`` where ``shape`` holds ints
    for static dims and strings (the ``dim_param`` or ``"?"``) for dynamic ones.
    """

    def __init__(self, inputs: list[tuple[str, list]], hint: str = ""):
        self.inputs = list(inputs)
        listing = ", ".join(f"{n}{_fmt_shape(s)}" for n, s in self.inputs)
        msg = f"model has dynamic input dimensions that must be pinned: {listing}"
        if hint:
            msg += f"; {hint}"
        super().__init__(msg)


class UnsupportedOperatorsError(ImportErrorBase):
    """One or more operators cannot be imported.

    ``ops`` is the full list of ``(op_type, node_name)``.
    """

    def __init__(self, ops: list[tuple[str, str]]):
        self.ops = list(ops)
        by_type: dict[str, list[str]] = {}
        for op, name in self.ops:
            by_type.setdefault(op, []).append(name)
        parts = []
        for op, names in sorted(by_type.items()):
            shown = ", ".join(names[:5]) + (f", ... (+{len(names) - 5})" if len(names) > 5 else "")
            parts.append(f"{op} [{shown}]")
        super().__init__(
            f"{len(self.ops)} node(s) use operators that cannot be imported: " + "; ".join(parts)
        )


class ConversionError(ImportErrorBase):
    """The TVM Relax frontend (or one of our converters) failed on one node."""

    def __init__(self, op_type: str | None, node_name: str | None, detail: str):
        self.op_type = op_type
        self.node_name = node_name
        self.detail = detail
        where = f"{op_type} node '{node_name}'" if op_type else "model"
        super().__init__(f"failed to import {where}: {detail}")


class PrepareError(ImportErrorBase):
    """The ONNX model could not be prepared (invalid model, bad shape_dict, ...)."""


def _fmt_shape(shape) -> str:
    if shape is None:
        return "[unknown rank]"
    return "[" + ", ".join(str(d) for d in shape) + "]"


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
