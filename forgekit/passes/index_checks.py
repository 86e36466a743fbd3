"""Bounds checks on the indices of gather-like operators: an index read from a model's inputs is data.

TVM legalizes ``take`` (ONNX Gather), ``gather_elements``, ``gather_nd``, ``scatter_elements`` and
``scatter_nd`` with no check: ``take``'s default mode is "fast" ("extra indices lead to seg fault").  A
BERT-style model given ``input_ids`` = 2e9 read 8 GB past its embedding table and died with SIGSEGV;
``token_type_ids`` = 7 into a 2-row table read another tensor's bytes and returned them with exit 0; a
ScatterND index writes wherever it points.  onnxruntime refuses all of them.  This pass routes the indices of
every such call through a kernel that copies them and asserts each one inside the axis it indexes; a failed
assertion ends the VM call with an ``IndexError`` whose message starts with :data:`MARKER`, which the runtimes
(``forgekit.runtime.Engine``, the C API) turn into one line and exit 9 (InputError).

Why not the modes TVM has: ``take(mode="clip"|"wrap")`` returns an answer onnxruntime refuses (a silent wrong
answer), ``"nan"`` exists for ``take`` on floats only, and the other operators have no mode.  Why a kernel of
its own rather than an assertion inside the gather: the gather is fused with its consumers (an embedding with
its add and layer norm) and scheduled in parallel, where an assertion cannot stop the call; the copy is one
pass over the indices (a BERT input: 128 integers), opaque to fusion and left serial.

Ranges: ``take``, ``gather_elements``, ``gather_nd`` and ``scatter_nd`` get indices the ONNX importer already
moved from [-n, 0) to [0, n), and their kernels read a negative index as it is, so [0, n) is checked;
``scatter_elements`` shifts negative indices itself (and the importer does not), so [-n, n).  OneHot needs
none: TVM computes it by comparison, and an index outside [-depth, depth) gives an all-off row, as ONNX says.

CPU targets only (phase 0 of :func:`forgekit.backends.cpu.pipeline.lowering_pipeline`): a CUDA kernel cannot end the
VM call with an error; GPU builds keep TVM's behaviour (documented in docs/deployment.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tvm
from tvm import relax

from ..errors import INDEX_ERROR_MARKER as MARKER  # the runtimes look for it to give exit 9
from .functions import rewrite_functions
from .names import ORIGINAL_NAMES

#: TVM's error kind of the assertion (tvm_ffi raises the Python exception of that name)
KIND = "IndexError"


@dataclass(frozen=True)
class _Gather:
    """How one operator reads its indices: the ONNX name, whether negative indices are valid when they reach
    it (its kernel shifts them)."""

    onnx: str
    negative_ok: bool = False
    coordinates: bool = False  # the last axis of the indices holds coordinates (GatherND/ScatterND)


_OPS = {
    "relax.take": _Gather("Gather"),
    "relax.gather_elements": _Gather("GatherElements"),
    "relax.gather_nd": _Gather("GatherND", coordinates=True),
    "relax.scatter_elements": _Gather("ScatterElements", negative_ok=True),
    "relax.scatter_nd": _Gather("ScatterND", coordinates=True),
}


def _static(value: Any) -> int | None:
    return int(value.value) if isinstance(value, tvm.tirx.IntImm) else (value if isinstance(value, int) else None)


def _int64(value: Any) -> Any:
    """``value`` (an int or a PrimExpr) as an int64 PrimExpr: the kernel's extent parameters are int64."""
    static = _static(value)
    if static is not None:
        return tvm.tirx.IntImm("int64", static)
    return value if str(value.ty) == "int64" else tvm.tirx.Cast("int64", value)


def _extents(call: Any, gather: _Gather) -> list[Any] | None:
    """The extents the indices of ``call`` index (one per coordinate for GatherND/ScatterND), or None when the
    data's shape or the number of coordinates is unknown."""
    data_shape = getattr(call.args[0].ty, "shape", None)
    index_shape = getattr(call.args[1].ty, "shape", None)
    if data_shape is None or not hasattr(data_shape, "values"):
        return None
    dims = list(data_shape.values)
    if gather.coordinates:
        if index_shape is None or not hasattr(index_shape, "values") or not list(index_shape.values):
            return None
        count = _static(list(index_shape.values)[-1])
        first = int(call.attrs.batch_dims) if call.op.name == "relax.gather_nd" else 0
        return None if count is None or first + count > len(dims) else dims[first:first + count]
    axis = getattr(call.attrs, "axis", None)
    if axis is None:  # take over the flattened tensor
        total: Any = 1
        for dim in dims:
            total = total * dim
        return [total]
    return [dims[int(axis) % len(dims)]]


def _check_source(rank: int, dtype: str, extents: list[Any], gather: _Gather, message: str) -> str:
    """TVMScript of the kernel: ``out = indices``, asserting each index in range.
    Extents are kernel parameters (int64 PrimValues), so one kernel serves symbolic shapes.  Block form
    (``s_tir``): Relax's analyses of call_tir kernels (op patterns, reshape detection) require it."""
    dims = [f"n{i}" for i in range(rank)]
    loops = [f"i{i}" for i in range(rank)]
    axes = [f"v{i}" for i in range(rank)]
    shape = "(" + ", ".join(dims) + ("," if rank == 1 else "") + ")"
    at = "[" + ", ".join(axes) + "]" if rank else "[()]"
    bound = f"bound{len(extents) - 1}"
    for j in range(len(extents) - 2, -1, -1):  # the coordinate's own extent (GatherND/ScatterND)
        bound = f"T.Select({axes[-1]} == T.int64({j}), bound{j}, {bound})"
    value = f"T.Cast('int64', idx{at})"
    low = f"T.int64(0) - {bound}" if gather.negative_ok else "T.int64(0)"
    body = [f"T.reads(idx{at})", f"T.writes(out{at})",
            f"assert {low} <= {value} and {value} < {bound}, ({KIND!r}, [{message!r}])", f"out{at} = idx{at}"]
    indent = "    "
    lines = [
        "@T.prim_func(private=True, s_tir=True)",
        "def check(var_idx: T.handle, " + "".join(f"bound{j}: T.int64, " for j in range(len(extents)))
        + "var_out: T.handle):",
        # opaque: never fused into the gather (its loops are parallel); scheduled: no rule reorders it
        indent + 'T.func_attr({"tirx.is_scheduled": True, "op_pattern": 8, "tirx.noalias": True})',
        *[f"{indent}{d} = T.int64()" for d in dims],
        f'{indent}idx = T.match_buffer(var_idx, {shape}, "{dtype}")',
        f'{indent}out = T.match_buffer(var_out, {shape}, "{dtype}")',
    ]
    if rank:
        lines.append(f"{indent}for {', '.join(loops)} in T.grid({', '.join(dims)}):")
        indent *= 2
    lines.append(f'{indent}with T.sblock("check_indices"):')
    indent += "    "
    if rank:
        lines.append(f"{indent}{', '.join(axes)} = T.axis.remap(\"{'S' * rank}\", [{', '.join(loops)}])")
    lines += [indent + line for line in body]
    return "\n".join(lines)


def _message(gather: _Gather, extents: list[Any], sources: list[str]) -> str:
    """The one line a bad index gives: which operator, which range, from which input."""
    static = [_static(e) for e in extents]
    if len(extents) == 1 and static[0] is not None:
        where = f"outside [-{static[0]}, {static[0] - 1}] (the axis it indexes has {static[0]})"
    elif all(s is not None for s in static):
        where = "outside the axes it indexes (" + " x ".join(str(s) for s in static) + ")"
    else:
        where = "outside the axis it indexes"
    origin = f" from input {', '.join(repr(s) for s in sources)}" if sources else ""
    return (f"{MARKER}: an index{origin} is {where} in a {gather.onnx}; onnxruntime refuses it too: pass "
            "indices inside the table they index.")


@relax.expr_functor.mutator
class _Checker(relax.PyExprMutator):
    def __init__(self, mod: Any) -> None:
        super().__init__(mod)
        self.params: dict[Any, str] = {}  # parameter -> its name as the user knows it (names.ORIGINAL_NAMES)
        self.count = 0

    def _sources(self, expr: Any, depth: int = 0) -> list[str]:
        """Names of the function parameters ``expr`` is computed from (through at most 32 bindings)."""
        if isinstance(expr, relax.Var):
            if expr in self.params:
                return [self.params[expr]]
            bound = self.lookup_binding(expr)
            return self._sources(bound, depth + 1) if bound is not None and depth < 32 else []
        names: list[str] = []
        for child in list(getattr(expr, "args", None) or []) + list(getattr(expr, "fields", None) or []):
            names += [n for n in self._sources(child, depth + 1) if n not in names]
        return names

    def visit_function_(self, func: Any) -> Any:
        original = func.attrs.get(ORIGINAL_NAMES) if func.attrs is not None else None
        names = [str(n) for n in original] if original is not None else [p.name for p in func.params]
        self.params.update(zip(func.params, names))
        return super().visit_function_(func)

    def visit_call_(self, call: Any) -> Any:
        call = super().visit_call_(call)
        gather = _OPS.get(call.op.name) if isinstance(call.op, tvm.ir.Op) else None
        if gather is None or (call.op.name == "relax.take" and str(call.attrs.mode) != "fast"):
            return call
        indices = call.args[1]
        ty = indices.ty
        if isinstance(indices, tvm.ir.expr.Constant) or not isinstance(ty, relax.TensorType) or ty.ndim < 0:
            return call  # constant indices: the importer and FoldConstant evaluated them on the weights
        extents = _extents(call, gather)
        if extents is None:
            return call
        message = _message(gather, extents, self._sources(indices))
        source = _check_source(ty.ndim, str(ty.dtype), extents, gather, message)
        func = tvm.script.from_source(source, extra_vars={"T": tvm.script.tirx})
        gv = self.builder_.add_func(func, f"check_indices_{self.count}")
        self.count += 1
        bounds = [relax.prim_value(_int64(e)) for e in extents]
        checked = self.builder_.emit(relax.call_tir(gv, [indices, *bounds], ty), name_hint="checked_indices")
        return relax.Call(call.op, [call.args[0], checked, *call.args[2:]], call.attrs, call.ty_args)


def check_indices(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every gather-like call's non-constant indices checked (see the module docstring)."""
    return rewrite_functions(_Checker(mod), mod)


def check_indices_pass() -> Any:
    """:func:`check_indices` as a module pass (the first pass of every CPU lowering pipeline)."""

    @tvm.transform.module_pass(opt_level=0, name="forgekit.CheckIndices")
    def _pass(mod: Any, _ctx: Any) -> Any:
        return check_indices(mod)

    return _pass
