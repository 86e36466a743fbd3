"""Inputs read where the caller put them, outputs handed over as the VM made them: no copy either way.

``Engine.infer`` copied every input and every output.  On a Relu over [1, 40, 16000] (2.5 MB each way) the
kernel took 0.15 ms and ``infer`` 1.02 ms, against onnxruntime's 0.17 ms for its whole ``run``, which wraps
numpy arrays without copying them.  Two things forced the copies:

* **Inputs.**  TVM declares every kernel buffer 64-byte aligned and LLVM emits aligned vector moves from it:
  numpy arrays are 16-byte aligned, and a kernel reading one directly crashes the process (a segfault, not an
  error).  This pass declares the buffers of the kernels that read a function's parameters (or a view of
  one) with their element's alignment, so LLVM emits unaligned moves there: on x86 and Arm they cost the
  same on aligned data.  Every other kernel keeps 64 bytes.
* **Outputs.**  An output may be a parameter, a view of one, a constant (read-only data of the library:
  writing to a view of it crashes), or one of two views of the same storage; a copy was always safe.  This
  pass tells them apart on the lowered ``main``: an output is *owned* when its storage is allocated by the
  call itself (``R.vm.alloc_storage``), possibly under reshape views, and no earlier output shares it.  An
  owned output can be given to the caller as it is: the next call allocates anew.

The findings go in the artifact's metadata (``build.io``, :class:`IoPlan`); an artifact without them is
read as before (64-byte aligned copies, copied outputs).

Why not TVM: its ``tirx`` lowering takes the alignment of each buffer as declared, and no TVM pass classifies
a function's outputs by where their storage comes from (``StaticPlanBlockMemory`` only leaves them unplanned).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: the packed functions after which a tensor is a view of its first argument's storage
_VIEWS = frozenset({"vm.builtin.reshape"})


@dataclass
class IoPlan:
    """What :func:`io_buffers_pass` found, for the metadata: whether the kernels take inputs at any element-
    aligned address, and which of ``main``'s outputs (flattened, as the VM returns them) are owned."""

    element_aligned_inputs: bool = False
    owned_outputs: list[bool] = field(default_factory=list)

    def to_metadata(self) -> dict[str, Any]:
        """``build.io`` of the metadata (absent: 64-byte aligned inputs, no output owned)."""
        return {"input_alignment": "element" if self.element_aligned_inputs else 64,
                "owned_outputs": list(self.owned_outputs)}

    @staticmethod
    def of_levels(plans: list[IoPlan | None]) -> IoPlan | None:
        """What holds for every level of an artifact (None when a level has no plan: not a CPU build)."""
        if not plans or any(p is None for p in plans):
            return None
        counts = {len(p.owned_outputs) for p in plans if p is not None}
        owned = [all(flags) for flags in zip(*(p.owned_outputs for p in plans if p is not None))]
        return IoPlan(all(p.element_aligned_inputs for p in plans if p is not None),
                      owned if len(counts) == 1 else [])


def io_buffers_pass(plan: IoPlan | None = None) -> Any:
    """The module pass (last in a CPU build's Relax pipeline): element-aligned input buffers, and ``plan``
    filled when given."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="forgekit.IoBuffers")
    def _pass(mod: Any, _ctx: Any) -> Any:
        out = element_aligned_inputs(mod)
        if plan is not None:
            plan.element_aligned_inputs = True
            plan.owned_outputs = owned_outputs(out["main"]) if _has(out, "main") else []
        return out

    return _pass


def _has(mod: Any, name: str) -> bool:
    return any(gv.name_hint == name for gv in mod.get_global_vars())


def element_aligned_inputs(mod: Any) -> Any:
    """``mod`` where every kernel argument that may be a Relax function's parameter (any function: the bodies
    of Loops are functions given the caller's tensors) has its buffer declared with its element's alignment."""
    import tvm
    from tvm import relax, tirx

    reads: dict[Any, set[int]] = {}
    for _gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            _note_parameter_reads(func, reads)
    if not reads:
        return mod
    funcs = {gv: func for gv, func in mod.functions_items()}
    for gv, positions in reads.items():
        if isinstance(funcs[gv], tirx.PrimFunc):
            funcs[gv] = _with_element_alignment(funcs[gv], positions)
    return tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)


def _note_parameter_reads(func: Any, reads: dict[Any, set[int]]) -> None:
    """Add to ``reads`` the (kernel, argument position) pairs of ``func``'s calls that take a tensor which
    may be one of ``func``'s parameters: the parameters, anything bound to an expression that mentions one
    (views, tuples, branches), conservatively."""
    from tvm import relax

    aliases = set(func.params)

    def visit(expr: Any) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, relax.GlobalVar):
            for k, arg in enumerate(expr.args):
                if isinstance(arg, relax.Var) and arg in aliases:
                    reads.setdefault(expr.op, set()).add(k)
        if isinstance(expr, relax.VarBinding) and _mentions(expr.value, aliases):
            aliases.add(expr.var)

    # bindings in order, each after its value, and a branch's before the If that binds its result: ``aliases``
    # grows as the function reads
    _visit_bindings(func.body, visit)


def _visit_bindings(body: Any, visit: Any) -> None:
    """``visit`` every binding of ``body`` (a SeqExpr), branches first, in order."""
    from tvm import relax

    for block in body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.If):
                _visit_bindings(value.true_branch, visit)
                _visit_bindings(value.false_branch, visit)
            relax.analysis.post_order_visit(value, visit)
            visit(binding)


def _mentions(expr: Any, names: set[Any]) -> bool:
    from tvm import relax

    return any(v in names for v in relax.analysis.free_vars(expr))


def _with_element_alignment(func: Any, positions: set[int]) -> Any:
    """``func`` with the buffers at ``positions`` of its parameters declared with their element's alignment."""
    import tvm_ffi
    from tvm import ir, tirx

    fresh: dict[Any, Any] = {}
    for k in sorted(positions):
        if k >= len(func.params):
            continue
        buf = func.params[k]
        align = getattr(buf, "data_alignment", None)
        if align is None or not hasattr(buf, "offset_factor"):  # a scalar parameter (a shape variable)
            continue
        element = max(1, tvm_ffi.dtype(str(buf.dtype)).bits * tvm_ffi.dtype(str(buf.dtype)).lanes // 8)
        if align <= element:
            continue
        fresh[buf] = tirx.decl_buffer(buf.shape, buf.dtype, buf.name, strides=buf.strides,
                                      elem_offset=buf.elem_offset, scope=buf.scope(), data_alignment=element,
                                      offset_factor=buf.offset_factor, layout=buf.layout)
    if not fresh:
        return func
    body = tvm_ffi.structural_map(func.body, [(ir.Var, lambda v: fresh.get(v, v))], order="post")
    return tirx.PrimFunc([fresh.get(p, p) for p in func.params], body, func.ret_type, func.attrs)


def owned_outputs(main: Any) -> list[bool]:
    """For each tensor ``main`` returns (nested tuples flattened, in order), whether the caller may keep it
    without a copy: its storage is allocated by this call, and no earlier output shares it."""
    from tvm import relax

    bound: dict[Any, Any] = {}
    for block in main.body.blocks:
        for binding in block.bindings:
            if isinstance(binding, relax.VarBinding):
                bound[binding.var] = binding.value

    def storage(expr: Any) -> Any | None:
        """The storage var a tensor lives in when this call allocated it; None when unknown."""
        while isinstance(expr, relax.Var) and expr in bound:
            value = bound[expr]
            if isinstance(value, relax.Call) and isinstance(value.op, relax.ExternFunc):  # R.call_packed
                if str(value.op.global_symbol) not in _VIEWS or not value.args:
                    return None
                expr = value.args[0]
                continue
            if isinstance(value, relax.Call):
                name = getattr(value.op, "name", "")
                if name == "relax.vm.alloc_tensor" and isinstance(value.args[0], relax.Var):
                    source = bound.get(value.args[0])
                    if isinstance(source, relax.Call) and getattr(source.op, "name", "") == "relax.vm.alloc_storage":
                        return value.args[0]
                    return None
                return None
            if isinstance(value, relax.Var):
                expr = value
                continue
            return None
        return None

    leaves: list[Any] = []

    def flatten(expr: Any) -> None:
        while isinstance(expr, relax.Var) and isinstance(bound.get(expr), relax.Tuple):
            expr = bound[expr]
        if isinstance(expr, relax.Tuple):
            for item in expr.fields:
                flatten(item)
        else:
            leaves.append(expr)

    flatten(main.body.body)
    seen: set[Any] = set()
    owned = []
    for leaf in leaves:
        root = storage(leaf)
        owned.append(root is not None and root not in seen)
        if root is not None:
            seen.add(root)
    return owned

