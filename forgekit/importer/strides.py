"""Dynamic dimensions that only take multiples of a step (``--dynamic H=32..2048:32``).

Detectors with feature pyramids (YOLOv8, PP-OCR's DB head, RetinaNet...) add a coarse map, upsampled 2x,
to a finer one.  With ``H`` symbolic their heights are ``2 * ((H - 1) // 32 + 1)`` and ``(H - 1) // 16 + 1``:
equal only when ``H`` is a multiple of 32 (the models need that anyway; onnxruntime fails on other sizes),
so TVM cannot give the sum a shape and every converter after it fails.  Writing the dimension as
``32 * H_div32`` makes both sides ``2 * H_div32``: TVM's simplifier proves that on its own.

TVM's VM cannot read ``H_div32`` out of an input of height ``32 * H_div32`` (a parameter's shape may only
*define* plain variables), so after the import ``main`` takes ``H`` again and defines ``H_div32`` from it
with two ``match_cast`` s, the second of which also checks at run time that ``H`` is a multiple of 32.

Why not a TVM pass: Relax has no notion of divisibility constraints on shape variables
(``Analyzer.constraint_scope(H % 32 == 0)`` does not simplify ``H // 32 * 32`` to ``H``), so the
substitution has to happen before the converters derive shapes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .dynamic import quotient_name


def stepped_symbols(ranges: Mapping[str, Any]) -> dict[str, tuple[int, Any]]:
    """``{name: (step, quotient var)}`` for the ranges with a step > 1."""
    import tvm

    return {name: (r.step, tvm.tirx.Var(quotient_name(name, r.step), "int64"))
            for name, r in ranges.items() if getattr(r, "step", 1) > 1}


def input_dim(name: str, stepped: Mapping[str, tuple[int, Any]], plain: Any) -> Any:
    """The dimension the importer gives TVM for symbol ``name``: ``step * quotient`` or ``plain``."""
    if name in stepped:
        step, quotient = stepped[name]
        return step * quotient
    return plain


def _rewrite_dims(shape: Any, stepped: Mapping[str, tuple[int, Any]], plain: Mapping[str, Any]) -> list[Any]:
    """``step * q`` -> the plain variable; anything else using ``q`` -> ``q`` replaced by ``plain // step``."""
    import tvm
    from tvm.relax.utils import _substitute_tir_vars

    analyzer = tvm.sym.Analyzer()
    by_var = {q: (name, step) for name, (step, q) in stepped.items()}
    out = []
    for dim in shape:
        used = [v for v in tvm.tirx.analysis.undefined_vars(dim) if v in by_var] if not isinstance(dim, int) else []
        exact = next((v for v in used if analyzer.can_prove_equal(dim, by_var[v][1] * v)), None)
        if exact is not None:
            out.append(plain[by_var[exact][0]])
        elif used:
            out.append(_substitute_tir_vars(dim, {q: tvm.tirx.floordiv(plain[name], step)
                                                  for name, (step, q) in stepped.items()}))
        else:
            out.append(dim)
    return out


def _plain_type(ty: Any, stepped, plain) -> Any:
    from tvm import relax

    shape = getattr(ty, "shape", None)
    if isinstance(ty, relax.TensorType) and shape is not None and hasattr(shape, "values"):
        return relax.TensorType(_rewrite_dims(shape.values, stepped, plain), ty.dtype)
    if isinstance(ty, relax.TupleType):
        return relax.TupleType([_plain_type(f, stepped, plain) for f in ty.fields])
    return ty


def restore_plain_inputs(mod: Any, stepped: Mapping[str, tuple[int, Any]]) -> Any:
    """``mod`` whose ``main`` takes the stepped dimensions as plain variables again and defines each
    quotient from them (``q = H // step``, then ``match_cast`` of the input to ``step * q``, which the VM
    checks at run time)."""
    import tvm
    from tvm import relax

    if not stepped:
        return mod
    main = mod["main"]
    present = {v for p in main.params for dim in getattr(getattr(p.ty, "shape", None), "values", None) or []
               if not isinstance(dim, int) for v in tvm.tirx.analysis.undefined_vars(dim)}
    stepped = {name: sq for name, sq in stepped.items() if sq[1] in present}
    if not stepped:
        return mod
    plain = {name: tvm.tirx.Var(name, "int64") for name in stepped}
    params, casts = [], []
    for param in main.params:
        new_ty = _plain_type(param.ty, stepped, plain)
        if tvm_equal(new_ty, param.ty):
            params.append(param)
            continue
        fresh = relax.Var(param.name, new_ty)
        params.append(fresh)
        casts.append(relax.MatchCast(param, fresh, param.ty))
    names = list(stepped)
    quotients = relax.Var("stepped_dims", relax.ShapeType(ndim=len(names)))
    defined = relax.Var("stepped_quotients", relax.ShapeType([stepped[n][1] for n in names]))
    prologue = relax.BindingBlock([
        relax.VarBinding(quotients, relax.ShapeExpr([tvm.tirx.floordiv(plain[n], stepped[n][0]) for n in names])),
        relax.MatchCast(defined, quotients, relax.ShapeType([stepped[n][1] for n in names])),
        *casts,
    ])
    body = relax.SeqExpr([prologue, *main.body.blocks], main.body.body)
    ret = _plain_type(main.ret_ty, stepped, plain)
    new_main = relax.Function(params, body, ret, main.is_pure, main.attrs, main.span)
    mod = mod.clone() if hasattr(mod, "clone") else mod
    mod["main"] = new_main
    return mod


def restore_quotient_prologue(mod: Any) -> Any:
    """``mod`` whose ``main`` defines its stepped quotients as :func:`restore_plain_inputs` did, after a rewrite
    re-normalized them: in a plain binding block, from a shape whose values TVM does not see.

    ``Normalize`` types ``stepped_dims`` as ``R.Shape([H // 32])``, and ``ToNonDataflow`` + ``ConvertToDataflow``
    move it into the first dataflow block (the calibration's :func:`forgekit.quantize.graph.expose` does both).
    TVM then reads ``H_div32 = H // 32`` off the ``match_cast`` and writes ``H // 32`` wherever ``H_div32`` was,
    and FuseTIR refuses the call of a kernel that takes the quotient as its shape argument ("All shape inputs
    are expected to be single tirx var"): YOLOv8's anchor grid, an ``arange`` over ``H_div32``, at a dynamic
    image size.  Typed ``R.Shape(ndim=n)`` (n stepped dims) the quotient stays a variable, as in an uncalibrated
    build."""
    from tvm import relax

    main = mod["main"]
    blocks = list(main.body.blocks)
    if not blocks:
        return mod
    bindings = list(blocks[0].bindings)
    lead = 0
    while lead < len(bindings) and _is_shape_definition(bindings[lead]):
        lead += 1
    if lead == 0:
        return mod
    rest = bindings[lead:]
    later = {v for b in rest for v in relax.analysis.free_vars(b.value)}
    later |= {v for blk in blocks[1:] for b in blk.bindings for v in relax.analysis.free_vars(b.value)}
    later |= set(relax.analysis.free_vars(main.body.body))
    if any(b.var in later for b in bindings[:lead]):  # only definitions nothing reads can move as they are
        return mod
    renamed: dict[Any, Any] = {}
    lifted = []
    for b in bindings[:lead]:
        if isinstance(b, relax.MatchCast):
            var = relax.Var(b.var.name, b.var.ty)
            lifted.append(relax.MatchCast(var, renamed.get(b.value, b.value), b.ty))
        else:
            var = relax.Var(b.var.name, relax.ShapeType(ndim=len(b.value.values)))
            lifted.append(relax.VarBinding(var, b.value))
        renamed[b.var] = var
    kind = relax.DataflowBlock if isinstance(blocks[0], relax.DataflowBlock) else relax.BindingBlock
    head = [relax.BindingBlock(lifted)] + ([kind(rest)] if rest else [])
    body = relax.SeqExpr(head + blocks[1:], main.body.body)
    mod = mod.clone() if hasattr(mod, "clone") else mod
    mod["main"] = relax.Function(main.params, body, main.ret_ty, main.is_pure, main.attrs, main.span)
    return mod


def _is_shape_definition(binding: Any) -> bool:
    """``q = R.shape([H // 32])`` or ``match_cast(q, R.Shape([H_div32]))``: the prologue's two kinds of binding."""
    from tvm import relax

    if isinstance(binding, relax.MatchCast):
        return isinstance(binding.ty, relax.ShapeType)
    return isinstance(binding.value, relax.ShapeExpr)


def tvm_equal(a: Any, b: Any) -> bool:
    import tvm_ffi

    return bool(tvm_ffi.structural_equal(a, b))


#: elementwise ops whose result shape is the broadcast of their operands'
_BROADCASTING = {"add", "subtract", "multiply", "divide", "floor_divide", "power", "maximum", "minimum", "where",
                 "equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "logical_and",
                 "logical_or", "mod", "floor_mod"}


def unprovable_broadcast(mod: Any) -> str | None:
    """Where ``main`` combines two tensors of known shapes into one of unknown shape (TVM could not prove
    two symbolic extents equal, e.g. a feature pyramid's ``(H - 1) // 16 + 1`` and
    ``2 * ((H - 1) // 32 + 1)``), a one-line description of it; else None.  Such a module imports but
    fails later with "emit_te now only supports Tensor that has ShapeExpr shape" and no advice."""
    from tvm import relax

    found: list[str] = []

    def shape_of(expr: Any) -> Any:
        return getattr(getattr(expr, "ty", None), "shape", None)

    def visit(expr: Any) -> None:
        if found or not isinstance(expr, relax.Call) or not hasattr(expr.op, "name"):
            return
        name = str(expr.op.name).rsplit(".", 1)[-1]
        if name not in _BROADCASTING or shape_of(expr) is not None:
            return
        shapes = [shape_of(a) for a in expr.args if isinstance(getattr(a, "ty", None), relax.TensorType)]
        if len(shapes) >= 2 and all(s is not None for s in shapes):
            found.append(f"{name} of tensors shaped {' and '.join(str(list(s.values)) for s in shapes)} has no "
                         "provable shape (the symbolic extents may differ)")

    relax.analysis.post_order_visit(mod["main"], visit)
    return found[0] if found else None
