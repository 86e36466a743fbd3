"""Parallel loops over a symbolic extent run serially when the call is small.

A static kernel below :data:`~.rules.common.MIN_PARALLEL_ELEMS` iterations is scheduled single-threaded:
a parallel region costs a fork/join.  A kernel over a dynamic sequence length or width cannot know its size
when it is scheduled, so it is always parallel, and at small sizes the fork/join is most of its time: the
``[1, S, 4, 64] -> [1, 4, S, 64]`` transpose of a BERT-style encoder takes 6.4 us parallel and 0.17 us
serial at S=16 (2.4 us serial at S=128; this machine, 2 threads).  At S=16 such kernels made the dynamic
encoder 1.3-1.5x slower than its static twin.

This pass gives each root-level loop nest of a kernel that holds a parallel loop and whose work is
symbolic both forms: ``if work < MIN_PARALLEL_ELEMS: <serial copy> else: <nest>``, where ``work`` counts
the innermost statements the nest runs (a vectorized loop counts once: one vector instruction), evaluated
at run time.  The copy has its own loop variables and its own copies of the buffers only that nest uses
(sharing the matmul accumulator between both copies kept TVM from shrinking it to a tile: the q @ k^T
kernel ran 3x slower).  Nests whose inner extents depend on enclosing loop variables, and nests that are
never small (a dynamic batch of 224x224 images), are left alone.

Why not TVM: its schedules and passes have no size-dependent parallelism (``tirx.transform`` has no such
pass, and MetaSchedule tunes one static shape).
"""

from __future__ import annotations

from typing import Any

from .rules.common import MIN_PARALLEL_ELEMS


def _work(stmt: Any, outer: set[Any]) -> Any | None:
    """Iterations of the innermost statements of ``stmt`` (a PrimExpr or int), None when an extent depends
    on a loop variable (a triangular nest)."""
    import tvm

    tirx = tvm.tirx
    if isinstance(stmt, tirx.For):
        extent = stmt.extent
        if not isinstance(extent, tirx.IntImm) and any(v in outer for v in tirx.analysis.undefined_vars(extent)):
            return None
        inner = _work(stmt.body, outer | {stmt.loop_var})
        if stmt.kind == tirx.ForKind.VECTORIZED:
            return inner  # one vector instruction per iteration of the body, not one per lane
        return None if inner is None else extent * inner
    if isinstance(stmt, tirx.SeqStmt):
        total: Any = 0
        for child in stmt.seq:
            part = _work(child, outer)
            if part is None:
                return None
            total = total + part
        return total
    if isinstance(stmt, tirx.IfThenElse):
        return _work(stmt.then_case, outer)
    block = getattr(stmt, "block", None)
    if block is not None:  # SBlockRealize
        return _work(block.body, outer)
    inner = getattr(stmt, "body", None)
    if isinstance(inner, tirx.Stmt):
        return _work(inner, outer)
    return 1


#: Code size (characters of the nest's TVMScript, unrolled loops counted once) above which a nest gets no
#: serial copy: LLVM's time grows faster than the code, and copies of the big fused kernels of ddddocr's
#: quantized recognizer (dequantize, conv, requantize: 13k to 96k characters) took its compile from 100 to
#: 380 s.  The transposes (~1.5k), elementwise chains and attention matmuls (~8k) the copies are for stay
#: below it.
MAX_TWIN_CHARS = 10_000


def _refs(stmt: Any) -> set[Any]:
    """Every variable (buffers are variables too) ``stmt`` mentions."""
    import tvm
    import tvm_ffi

    seen: set[Any] = set()

    def note(var: Any) -> Any:
        seen.add(var)
        return var

    tvm_ffi.structural_map(stmt, [(tvm.ir.Var, note)], order="post")
    return seen


def _serial_copy(stage: Any, own_buffers: list[Any]) -> Any:
    """``stage`` with its parallel loops serial and every variable it defines (loop and block iteration
    variables, lets) and every buffer only it uses replaced by a new one: TIR's lowering binds each variable
    once, and the copy sits next to the original.  The copied buffers are allocated by an opaque block
    around the copy, so TVM still places (and shrinks) each allocation where the copy uses it."""
    import tvm
    import tvm_ffi
    from tvm.s_tir.stmt import SBlock, SBlockRealize

    tirx = tvm.tirx
    fresh: dict[Any, Any] = {}

    def renew(var: Any) -> None:
        fresh.setdefault(var, tirx.Var(var.name, var.ty))

    def on_for(node: Any) -> Any:
        renew(node.loop_var)
        if node.kind != tirx.ForKind.PARALLEL:
            return node
        return tirx.For(node.loop_var, node.min, node.extent, tirx.ForKind.SERIAL, node.body,
                        annotations=node.annotations, step=node.step)

    def on_block(node: Any) -> Any:
        for iv in node.iter_vars:
            renew(iv.var)
        for match in node.match_buffers:  # a tensorized block's view of its operands (int8 vpdpbusd tiles)
            fresh.setdefault(match.buffer, _fresh_view(match.buffer))
        return node

    def on_let(node: Any) -> Any:
        renew(node.var)
        return node

    serial = tvm_ffi.structural_map(stage, [(tirx.For, on_for), (SBlock, on_block), (tirx.LetStmt, on_let)],
                                    order="post")
    buffers = [tirx.decl_buffer(b.shape, b.dtype, f"{b.name}_serial", scope=b.scope()) for b in own_buffers]
    fresh.update(zip(own_buffers, buffers))
    serial = tvm_ffi.structural_map(serial, [(tvm.ir.Var, lambda v: fresh.get(v, v))], order="post")
    if not buffers:
        return serial
    return SBlockRealize([], True, SBlock([], [], [], "serial_when_small", serial, alloc_buffers=buffers))


def _fresh_view(buf: Any) -> Any:
    """A new match buffer like ``buf``, with its own offset and stride variables: TIR's lowering binds a match
    buffer's ``elem_offset`` to the region it views, once; the copy shared the original's, so its region
    (the same formula on the copy's loop variables) could not be proven equal and every symbolic-batch int8
    kernel failed to compile ("buffer match constraint for A.elem_offset unmet", issue 39)."""
    import tvm

    tirx = tvm.tirx

    def renew(e: Any) -> Any:
        return tirx.Var(e.name, e.ty) if isinstance(e, tirx.Var) else e
    return tirx.decl_buffer(buf.shape, buf.dtype, buf.name, strides=[renew(s) for s in buf.strides],
                            elem_offset=renew(buf.elem_offset), scope=buf.scope(),
                            data_alignment=buf.data_alignment, offset_factor=buf.offset_factor)


def _has_parallel(stmt: Any) -> bool:
    import tvm
    import tvm_ffi

    found = []

    def note(node: Any) -> Any:
        found.append(node.kind == tvm.tirx.ForKind.PARALLEL)
        return node

    tvm_ffi.structural_map(stmt, [(tvm.tirx.For, note)], order="post")
    return any(found)


def _dims_positive(func: Any, root: Any) -> Any:
    """Every symbolic extent of the kernel's buffers is at least 1: the sizes it can be called with."""
    import tvm

    tirx = tvm.tirx
    dims = [d for b in [*func.params, *root.alloc_buffers] for d in (getattr(b, "shape", None) or [])
            if not isinstance(d, (int, tirx.IntImm))]
    valid: Any = tirx.const(True, "bool")
    for d in dims:
        valid = tirx.And(valid, d >= 1)
    return valid


def _twin_stages(func: Any) -> Any | None:
    """``func`` whose root-level loop nests with a parallel loop and a size known only at run time are
    ``if work < MIN_PARALLEL_ELEMS: <serial copy> else: <nest>``; None when nothing changed."""
    import tvm
    from tvm.s_tir.stmt import SBlock, SBlockRealize

    tirx = tvm.tirx
    realize = func.body
    if not isinstance(realize, SBlockRealize):
        return None
    root = realize.block
    stages = list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    refs = [_refs(stage) for stage in stages]
    valid = _dims_positive(func, root)
    changed = False
    out = []
    for k, stage in enumerate(stages):
        small_code = len(stage.script()) <= MAX_TWIN_CHARS
        work = _work(stage, set()) if small_code and _has_parallel(stage) else None
        if work is None or isinstance(work, (int, tirx.IntImm)):
            out.append(stage)
            continue
        analyzer = tvm.sym.Analyzer()
        for var in tirx.analysis.undefined_vars(work):  # shape variables: at least 1
            analyzer.update(var, tvm.sym.ConstIntBound(1, 2**62))
        small = analyzer.simplify(work < tirx.IntImm("int64", MIN_PARALLEL_ELEMS))
        with analyzer.constraint_scope(valid):
            never = analyzer.can_prove(tirx.Not(small))
        if never:
            # never small for sizes the kernel can take (a dynamic batch of 224x224 images; a valid conv
            # over ``frames - 6`` rows needs frames >= 7): a twin under ``N < 1`` or ``frames < 7`` makes
            # TVM's lowering see an empty or negative extent there and reject its divisions by it
            out.append(stage)
            continue
        own = [b for b in root.alloc_buffers if b in refs[k] and not any(b in r for j, r in enumerate(refs) if j != k)]
        out.append(tirx.IfThenElse(small, _serial_copy(stage, own), stage))
        changed = True
    if not changed:
        return None
    block = SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, tirx.SeqStmt(out) if len(out) > 1
                   else out[0], root.init, root.alloc_buffers, root.match_buffers, root.annotations)
    return func.with_body(SBlockRealize(realize.iter_values, realize.predicate, block))


def serial_when_small() -> Any:
    """The module pass: every PrimFunc's parallel loop nests of symbolic size get a serial twin."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="forgekit.SerialWhenSmall")
    def _pass(mod: Any, _ctx: Any) -> Any:
        updates = {}
        for gv, func in mod.functions.items():
            if isinstance(func, tvm.tirx.PrimFunc):
                twinned = _twin_stages(func)
                if twinned is not None:
                    updates[gv] = twinned
        if not updates:
            return mod
        mod = mod.clone() if hasattr(mod, "clone") else mod
        for gv, func in updates.items():
            mod[gv] = func
        return mod

    return _pass
