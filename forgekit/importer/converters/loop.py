"""ONNX ``Loop`` as a Relax function that calls itself: a while loop the VM runs, not an unrolled graph.

TVM 0.27's ONNX frontend has no ``Loop``.  Relax has no loop construct either, but it has ``If`` and
recursive functions, which together are one::

    def loop(i, trip, cond, v..., scans...):           # scans: the per-iteration outputs so far
        if i < trip and cond:
            cond', v'..., s... = body(i, cond, v...)
            return loop(i + 1, trip, cond', v'..., concat(scans, s)...)
        return v..., scans...

The body is imported on its own, through the same importer (preparation, folding, our converters), as a
model whose inputs are the body's: ``iteration_num``, ``cond`` and the loop-carried values, with the
shapes of the values the loop starts from (:func:`set_subgraph_importer` is how the importer lends itself
here without an import cycle).  The graph is closed over its outer scope before that
(:mod:`forgekit.importer.loops`).  Loop-carried values keep their shapes from one iteration to the next
(checked at run time); scan outputs are stacked along a new first axis whose length is only known when
the loop ends (``match_cast`` to a fresh symbolic dimension afterwards).  Compile time and code size do
not depend on the trip count.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import tvm
from onnx import helper
from tvm import relax
from tvm.relax.utils import _substitute_tir_vars

from ._common import OnnxOpConverter

#: (ONNX opset imports of the model being converted, the importer of a body model:
#:  ``(model, shape_dict) -> IRModule``); set by :func:`forgekit.importer.check.convert`.
_SUBGRAPHS: contextvars.ContextVar[tuple[list[Any], Callable[..., Any]] | None] = contextvars.ContextVar(
    "forgekit_loop_subgraphs", default=None)
_INT64_MAX = np.iinfo(np.int64).max
_counter = iter(range(1 << 62))


def set_subgraph_importer(opsets: list[Any], importer: Callable[..., Any]) -> contextvars.Token:
    return _SUBGRAPHS.set((list(opsets), importer))


def reset_subgraph_importer(token: contextvars.Token) -> None:
    _SUBGRAPHS.reset(token)


def _dims(ty: Any) -> list[Any]:
    return list(ty.shape.values)


def _dim_param(dim: Any, table: dict[str, Any]) -> int | str:
    if isinstance(dim, (int, tvm.tirx.IntImm)):
        return int(dim)
    name = dim.name if isinstance(dim, tvm.tirx.Var) else f"loop_dim{len(table)}"
    table.setdefault(name, dim)
    return name


def _import_body(body: onnx.GraphProto, carried: list[Any]) -> Any:
    """The body as a module whose ``main`` is ``(iteration_num, cond, v...) -> (cond', v'..., scans...)``."""
    state = _SUBGRAPHS.get()
    if state is None:
        raise ValueError("a Loop body can only be converted through forgekit's importer")
    opsets, importer = state
    graph = onnx.GraphProto()
    graph.CopyFrom(body)
    del graph.value_info[:]
    names: dict[str, Any] = {}
    graph.input[0].CopyFrom(helper.make_tensor_value_info(graph.input[0].name, onnx.TensorProto.INT64, []))
    graph.input[1].CopyFrom(helper.make_tensor_value_info(graph.input[1].name, onnx.TensorProto.BOOL, []))
    shapes = {}
    for vi, ty in zip(graph.input[2:], carried):
        dims = [_dim_param(d, names) for d in _dims(ty)]
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(str(ty.dtype)))
        vi.CopyFrom(helper.make_tensor_value_info(vi.name, elem, dims))
        shapes[vi.name] = dims
    for out in graph.output:
        if out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")
    model = helper.make_model(graph, opset_imports=opsets, producer_name="forgekit-loop-body")
    return importer(model, shapes)


def _transplant(bb: Any, mod: Any, uid: int) -> Any:
    """Add the body module's functions to ``bb``'s module (its ``main`` as ``loop_body_<uid>``, the rest
    under fresh names: a nested Loop's driver, a recurrence kernel), calls re-pointed at the new
    GlobalVars; the body's GlobalVar."""
    import tvm_ffi

    old = list(mod.get_global_vars())
    new = {gv: bb.add_func(mod[gv], f"loop_body_{uid}" if gv.name_hint == "main" else f"{gv.name_hint}_in{uid}")
           for gv in old}

    def remap(func: Any) -> Any:
        return tvm_ffi.structural_map(func, [(tvm.ir.GlobalVar, lambda g: new.get(g, g))], order="post")

    for gv in old:
        func = remap(mod[gv])
        if gv.name_hint == "main":
            func = func.without_attr("global_symbol")
        bb.update_func(new[gv], func)
    return next(new[gv] for gv in old if gv.name_hint == "main")


def _fresh_type(ty: Any, table: dict[str, Any]) -> Any:
    """``ty`` with every symbolic dimension a parameter variable of the loop function (one per name)."""
    dims = [int(d) if isinstance(d, (int, tvm.tirx.IntImm)) else
            table.setdefault(d.name if isinstance(d, tvm.tirx.Var) else f"loop_dim{len(table)}",
                             tvm.tirx.Var(d.name if isinstance(d, tvm.tirx.Var) else f"loop_dim{len(table)}",
                                          "int64"))
            for d in _dims(ty)]
    return relax.TensorType(dims, str(ty.dtype))


def _as_tensor(bb: Any, value: Any) -> Any:
    """``value`` as a tensor: the frontend keeps shape arithmetic (``Gather(Shape(x), 0)``) as scalar
    PrimExprs and shapes as ShapeExprs, which a function parameter of tensor type cannot take."""
    value = bb.normalize(value)
    if isinstance(value.ty, relax.ShapeType):
        return bb.normalize(relax.op.shape_to_tensor(value))
    if isinstance(value.ty, tvm.ir.PrimType):
        # a binding of a PrimValue, or a symbolic variable (in 0.27 both are Vars of PrimType)
        expr = (bb.lookup_binding(value) if isinstance(value, relax.Var) else None) or value
        tensor = relax.op.reshape(relax.op.shape_to_tensor(relax.ShapeExpr([tvm.tirx.Cast("int64", expr)])), [])
        if str(value.ty.dtype) != "int64":
            tensor = relax.op.astype(tensor, str(value.ty.dtype))
        return bb.normalize(tensor)
    return value


def _scalar(bb: Any, value: Any, dtype: str, default: Any) -> Any:
    if value is None:
        return relax.const(np.asarray(default, dtype=dtype), dtype)
    value = _as_tensor(bb, value)
    if str(value.ty.dtype) != dtype:
        value = relax.op.astype(value, dtype)
    return bb.normalize(relax.op.reshape(value, []))


def _bind(params: list[Any], types: list[Any]) -> dict[Any, Any]:
    """Symbolic dimensions of ``params`` -> the matching dimensions of ``types``."""
    out: dict[Any, Any] = {}
    for p, ty in zip(params, types):
        for d, actual in zip(_dims(p.ty), _dims(ty)):
            if isinstance(d, tvm.tirx.Var):
                out.setdefault(d, actual)
    return out


def convert_loop(bb: Any, inputs: list[Any], attr: dict[str, Any]) -> Any:
    body = attr["body"]
    trip, cond0, init = inputs[0], inputs[1], [_as_tensor(bb, v) for v in inputs[2:]]
    n_carried = len(init)
    carried = [v.ty for v in init]
    body_mod = _import_body(body, carried)
    body_fn = body_mod["main"]
    ret = body_fn.ret_ty
    outs = list(ret.fields) if isinstance(ret, relax.TupleType) else [ret]
    n_scan = len(outs) - 1 - n_carried
    if n_scan < 0:
        raise ValueError(f"the Loop body has {len(outs)} outputs for {n_carried} loop-carried values")
    # scan outputs' element shapes, in the caller's terms (for the empty start of each stack)
    binding = _bind(list(body_fn.params)[2:], carried)
    scan_elems = []
    allowed = _free_vars(carried)
    for ty in outs[1 + n_carried:]:
        dims = [d if isinstance(d, (int, tvm.tirx.IntImm)) else _substitute_tir_vars(d, binding)
                for d in _dims(ty)]
        free = [v for d in dims if not isinstance(d, (int, tvm.tirx.IntImm)) for v in tvm.tirx.analysis.undefined_vars(d)]
        if any(not any(v.same_as(a) for a in allowed) for v in free):
            raise ValueError("a Loop scan output whose shape depends on the data is not supported")
        scan_elems.append((dims, str(ty.dtype)))

    uid = next(_counter)
    body_gv = _transplant(bb, body_mod, uid)
    loop_gv = _loop_function(bb, body_gv, carried, scan_elems, uid)
    start = [relax.const(np.asarray(0, dtype="int64"), "int64"), _scalar(bb, trip, "int64", _INT64_MAX),
             _scalar(bb, cond0, "bool", True)]
    stacks = [bb.normalize(relax.op.zeros([0, *dims], dtype)) for dims, dtype in scan_elems]
    res = bb.emit(relax.Call(loop_gv, [*start, *init, *stacks]))
    results = [bb.emit(relax.TupleGetItem(res, k)) for k in range(n_carried)]
    for k, (dims, dtype) in enumerate(scan_elems):
        stacked = bb.emit(relax.TupleGetItem(res, n_carried + k))
        count = tvm.tirx.Var(f"loop{uid}_iterations", "int64")
        results.append(bb.match_cast(stacked, relax.TensorType([count, *dims], dtype)))
    return results[0] if len(results) == 1 else relax.Tuple(results)


def _free_vars(types: list[Any]) -> list[Any]:
    return [v for ty in types for d in _dims(ty) if not isinstance(d, (int, tvm.tirx.IntImm))
            for v in tvm.tirx.analysis.undefined_vars(d)]


def _loop_function(bb: Any, body_gv: Any, carried: list[Any], scan_elems: list[tuple[list[Any], str]],
                   uid: int) -> Any:
    """Add the recursive driver (see the module docstring) to ``bb``'s module; its GlobalVar."""
    table: dict[str, Any] = {}
    i = relax.Var("iter", relax.TensorType([], "int64"))
    trip = relax.Var("trip", relax.TensorType([], "int64"))
    cond = relax.Var("cond", relax.TensorType([], "bool"))
    values = [relax.Var(f"v{k}", _fresh_type(ty, table)) for k, ty in enumerate(carried)]
    stacks = [relax.Var(f"scan{k}", _fresh_type(relax.TensorType(
        [tvm.tirx.Var(f"scan{k}_len", "int64"), *dims], dtype), table)) for k, (dims, dtype) in enumerate(scan_elems)]
    params = [i, trip, cond, *values, *stacks]
    ret_ty = relax.TupleType([v.ty for v in values] + [relax.TensorType(ndim=len(d) + 1, dtype=t)
                                                       for d, t in scan_elems])
    name = f"loop_{uid}"
    # a stub with the same signature first, so that the real body can call the function's GlobalVar
    stub = relax.Function(params, relax.SeqExpr([], relax.Tuple([*values, *stacks])), ret_ty)
    gv = bb.add_func(stub, name)

    builder = relax.BlockBuilder(bb.get())
    with builder.function(f"{name}_impl", params, private=True):
        go = builder.emit(relax.op.logical_and(relax.op.less(i, trip), cond))
        builder._begin_binding_block()
        step = builder.emit(relax.Call(body_gv, [i, cond, *values]))
        new_cond = builder.emit(relax.op.reshape(relax.TupleGetItem(step, 0), []))
        new_values = [builder.match_cast(builder.emit(relax.TupleGetItem(step, 1 + k)), v.ty)
                      for k, v in enumerate(values)]
        new_stacks = []
        for k, stack in enumerate(stacks):
            item = builder.emit(relax.TupleGetItem(step, 1 + len(values) + k))
            new_stacks.append(builder.emit(relax.op.concat([stack, relax.op.expand_dims(item, 0)], axis=0)))
        nxt = builder.emit(relax.op.add(i, relax.const(np.asarray(1, dtype="int64"), "int64")))
        again = builder.emit(relax.Call(gv, [nxt, trip, new_cond, *new_values, *new_stacks]))
        then_seq = relax.SeqExpr([builder._end_block()], again)
        else_seq = relax.SeqExpr([], relax.Tuple([*values, *stacks]))
        result = builder.emit(relax.If(go, then_seq, else_seq))
        builder.emit_func_output(result)
    func = builder.get()[f"{name}_impl"]
    bb.update_func(gv, func)
    return gv


class Loop(OnnxOpConverter):
    """ONNX Loop (opset 11+; 13 and 16 only widened the types)."""

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        return convert_loop(bb, list(inputs), attr)


CONVERTERS = {"Loop": Loop}
