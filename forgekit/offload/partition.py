"""Partitions of a Relax module: list them, flatten them to their operators, measure them, inline them back.

A partition is what TVM's BYOC passes make (``FuseOpsByPattern`` + ``MergeCompositeFunctions``): a
global Relax function with a ``Codegen`` attribute whose body calls local ``Composite`` functions, one per
matched pattern, called from ``main``.  TVM has the forward passes but no inverse, so
:func:`inline_partitions` is ours: it puts every operator back where the partition's call was, binding the
partition's last operator to the call's own variable, so a partitioned-then-inlined module is structurally
equal to the module before partitioning (when the partitioner kept the operators' order, which it does for
the contiguous regions TensorRT's patterns make; ``tests/unit/test_offload_tensorrt.py`` checks it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable


@dataclass(frozen=True)
class Partition:
    """One offloaded subgraph: its function name, codegen, operators and multiply-accumulates."""

    name: str
    codegen: str
    ops: tuple[str, ...]
    macs: int
    inputs: tuple[tuple[tuple[int, ...], str], ...]
    outputs: tuple[tuple[tuple[int, ...], str], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "codegen": self.codegen, "ops": list(self.ops), "macs": self.macs,
                "inputs": [{"shape": list(s), "dtype": d} for s, d in self.inputs],
                "outputs": [{"shape": list(s), "dtype": d} for s, d in self.outputs]}


def codegen_functions(mod: Any) -> dict[str, Any]:
    """``{name: function}`` of every partition (a Relax function with a ``Codegen`` attribute), in module order."""
    from tvm import relax

    return {gv.name_hint: f for gv, f in mod.functions.items()
            if isinstance(f, relax.Function) and f.attrs is not None and "Codegen" in f.attrs}


def shapes_of(ty: Any) -> tuple[tuple[tuple[int, ...], str], ...]:
    """(static shape, dtype) of every tensor in a Relax type; symbolic dims read as -1."""
    from tvm import relax

    if isinstance(ty, relax.TupleType):
        return tuple(info for f in ty.fields for info in shapes_of(f))
    shape = getattr(ty, "shape", None)
    dims = []
    for v in (shape.values if shape is not None and hasattr(shape, "values") else ()):
        try:
            dims.append(int(v))
        except (TypeError, ValueError):
            dims.append(-1)
    return ((tuple(dims), str(ty.dtype)),)


def substitute(expr: Any, mapping: dict[Any, Any]) -> Any:
    """``expr`` with the variables of ``mapping`` replaced (partition bodies hold calls, tuples, items)."""
    from tvm import relax

    if isinstance(expr, relax.Var):
        return mapping.get(expr, expr)
    if isinstance(expr, relax.Call):
        # keep the call's type: the arguments have the parameters' types, so it still holds
        return relax.Call(expr.op, [substitute(a, mapping) for a in expr.args], expr.attrs, expr.ty_args,
                          ret_ty=expr.ty)
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([substitute(a, mapping) for a in expr.fields])
    if isinstance(expr, relax.TupleGetItem):
        return relax.TupleGetItem(substitute(expr.tuple_value, mapping), expr.index)
    return expr


def _bindings(func: Any) -> tuple[list[Any], Any]:
    body = func.body
    return [b for block in body.blocks for b in block.bindings], body.body


def apply_flat(func: Any, args: list[Any], emit: Callable[[Any, str], Any]) -> Any:
    """Apply a partition (or composite) function to ``args`` operator by operator: every binding but the
    result goes through ``emit(expr, name)`` (which returns the variable it bound); the result expression is
    returned unbound, for the caller to bind to its own variable."""
    from tvm import relax

    mapping = dict(zip(func.params, args))
    local: dict[Any, Any] = {}
    bindings, result = _bindings(func)
    for binding in bindings:
        value = binding.value
        if isinstance(value, relax.Function):
            local[binding.var] = value
            continue
        if isinstance(value, relax.Call) and isinstance(value.op, relax.Var) and value.op in local:
            expr = apply_flat(local[value.op], [substitute(a, mapping) for a in value.args], emit)
        else:
            expr = substitute(value, mapping)
        if binding.var.same_as(result):
            return expr
        mapping[binding.var] = emit(expr, str(binding.var.name))
    return substitute(result, mapping)


def flat_ops(func: Any) -> tuple[list[Any], list[tuple[Any, Any]], Any]:
    """A partition as plain data: (its parameters, ``[(var, expr)]`` of every operator, the result expression)."""
    from tvm import relax

    recorded: list[tuple[Any, Any]] = []

    def emit(expr: Any, name: str) -> Any:
        var = relax.Var(name, getattr(expr, "ty", None))
        recorded.append((var, expr))
        return var

    result = apply_flat(func, list(func.params), emit)
    return list(func.params), recorded, result


def op_name(expr: Any) -> str | None:
    import tvm
    from tvm import relax

    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return str(expr.op.name).removeprefix("relax.")
    return None


def macs_of(expr: Any) -> int:
    """Multiply-accumulates of one operator call (convolutions and matmuls; 0 for the rest)."""
    name = op_name(expr)
    if name is None:
        return 0
    out = shapes_of(expr.ty)[0][0] if hasattr(expr, "ty") else ()
    if not out or min(out) < 0:
        return 0
    volume = 1
    for d in out:
        volume *= d
    if name.startswith("nn.conv") and "transpose" not in name:
        (wshape, _), = shapes_of(expr.args[1].ty)
        per_out = 1
        for d in wshape[1:]:  # OI..: I is already in_channels / groups
            per_out *= d
        return volume * per_out
    if name == "matmul":
        (ashape, _), = shapes_of(expr.args[0].ty)
        return volume * max(ashape[-1], 0)
    return 0


def describe(mod: Any) -> list[Partition]:
    """Every partition of ``mod`` with its operators and MACs."""
    out = []
    for name, func in codegen_functions(mod).items():
        params, ops, result = flat_ops(func)
        exprs = [e for _, e in ops] + [result]
        names = tuple(n for n in (op_name(e) for e in exprs) if n)
        out.append(Partition(name, str(func.attrs["Codegen"]), names, sum(macs_of(e) for e in exprs),
                             tuple(i for p in params for i in shapes_of(p.ty)), shapes_of(func.ret_ty)))
    return out


def inline_partitions(mod: Any, names: Iterable[str] | None = None) -> Any:
    """``mod`` with the partitions ``names`` (default: all) put back into their callers and removed."""
    import tvm
    from tvm import relax

    targets = codegen_functions(mod)
    if names is not None:
        wanted = set(names)
        targets = {k: v for k, v in targets.items() if k in wanted}
    if not targets:
        return mod

    @relax.expr_functor.mutator
    class _Inline(relax.PyExprMutator):  # type: ignore[misc]
        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            if isinstance(call.op, tvm.ir.GlobalVar) and call.op.name_hint in targets:
                return apply_flat(targets[call.op.name_hint], list(call.args),
                                  lambda expr, name: self.builder_.emit(expr, name))
            return call

    inliner = _Inline(mod)
    functions = {}
    for gv, func in mod.functions.items():
        if gv.name_hint in targets:
            continue
        functions[gv] = inliner.visit_expr(func) if isinstance(func, relax.Function) else func
    return tvm.IRModule(functions, attrs=mod.attrs)
