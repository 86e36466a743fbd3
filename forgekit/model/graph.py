"""Pure functions on a Relax ``tvm.IRModule`` that the façade exposes: tensor specs, constants, identity."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..errors import CompileError


def _dim(value: Any) -> int | str:
    """A static dim as an int; a symbolic one as its expression in plain arithmetic (``(W - 5) // 8 + 1``,
    not TVM's ``(W - T.int64(5)) // T.int64(8) + T.int64(1)``)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return re.sub(r"T\.int(?:32|64)\((-?\d+)\)", r"\1", str(value))


def tensor_infos(ty: Any) -> list[tuple[tuple[int | str, ...], str]]:
    """(shape, dtype) of every tensor in a Relax type (tuples are flattened)."""
    from tvm import relax

    if isinstance(ty, relax.TupleType):
        return [info for f in ty.fields for info in tensor_infos(f)]
    shape = getattr(ty, "shape", None)
    dims = tuple(_dim(v) for v in shape.values) if shape is not None and hasattr(shape, "values") else ()
    return [(dims, str(ty.dtype))]


def const_array(const: Any) -> np.ndarray:
    """Data of a constant: tensors carry a ``tvm.runtime.Tensor``, scalar constants a Python value."""
    value = const.value
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def constants(func: Any) -> list[Any]:
    """Relax constants of ``func`` in a deterministic (post-)order, each once."""
    from tvm import relax
    from tvm.ir.expr import Constant  # TVM 0.27 moved relax.Constant here (data in ``.value``)

    found: list[Any] = []
    seen: set[int] = set()

    def visit(expr: Any) -> None:
        # A constant object can be referenced by several bindings; count its bytes once.
        if isinstance(expr, Constant) and expr.__chandle__() not in seen:
            seen.add(expr.__chandle__())
            found.append(expr)

    relax.analysis.post_order_visit(func, visit)
    return found


def to_tvm(value: Any) -> Any:
    import tvm

    return value if hasattr(value, "numpy") else tvm.runtime.tensor(np.asarray(value))


def simplify(mod: Any, *, fold_constants: bool, fold_batch_norms: bool) -> Any:
    """Constructor-time simplifications (Forge's ``fold_constants`` / ``fold_batch_norms``)."""
    from ..log import first_line, quiet_native
    from ..passes.batchnorm import fold_batch_norms as fold_bn
    from ..passes.numpy_fold import fold_constant

    try:
        with quiet_native("import"):  # FoldConstant legalizes and JIT-builds: TVM logs while it does
            if fold_constants or fold_batch_norms:
                mod = fold_constant(mod)  # TVM's, where it keeps the module whole
            if fold_batch_norms:
                mod = fold_bn(mod)
        return mod
    except Exception as exc:
        raise CompileError(f"Simplifying the imported graph failed: {first_line(exc)}") from exc


def input_values(source: Any, calibration: Any) -> dict[str, dict[str, float]]:
    """Input name -> the values it is meant to take (metadata ``values``): integer inputs that index a table
    its ``[0, size)`` (:mod:`forgekit.importer.index_ranges`), float inputs of a quantized model the range and
    moments of its calibration samples (``calibration``: the Calibration it was quantized with, or None)."""
    from ..importer.index_ranges import index_bounds
    from ..quantize.calibrate import input_values as calibrated

    bounds = index_bounds(source.model) if source is not None else {}
    return {**{name: {"min": 0, "max": size - 1} for name, size in bounds.items()}, **calibrated(calibration)}


def frozen_values(source: Any) -> dict[str, Any]:
    """Input name -> the value ``freeze`` made it (JSON-ready): the ONNX model still takes these inputs, so
    whoever runs it beside the artifact (``verify``, ``bench``) must feed them."""
    return {name: np.asarray(value).tolist() for name, value in (source.freeze if source is not None else {}).items()}
