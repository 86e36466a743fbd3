"""Register tiles of up to the register file on the stack: the TIR pipeline of CPU builds.

TVM 0.27's ``LowerTVMBuiltin`` keeps an allocation on the stack only if it is "global" scope and under 1024
bytes (``runtime::kMaxStackAlloca``, a limit for embedded stacks); anything larger is a
``TVMBackendAllocWorkspace``/``FreeWorkspace`` pair each time its loop body runs, and LLVM can no longer keep
it in registers.  An AVX-512 micro-kernel's accumulators fill 1024 bytes at 16 registers, two thirds of the
register file: a matmul of 8 rows over large weights needs 8 x 2 of them to read each weight panel once
(:func:`.rules.tiled.streams_weights`).  Here a "global" allocation of a constant size under
:data:`STACK_TILE_BYTES` is annotated ``disable_lower_builtin`` (TVM's own escape hatch), so it stays an LLVM
``alloca`` that SROA turns into registers.  2 KB per tile is far below any thread's stack (musl's 128 KB
default included).

TVM has no hook for a pass before ``LowerTVMBuiltin`` other than a named TIR pipeline (``tirx.build`` takes
a name, and the ``tirx.add_lower_pass`` option is no longer read): :func:`tir_pipeline` registers
``forgekit_cpu``, TVM's default ``s_tir`` pipeline with this pass first among the host finalization passes,
and :func:`keep_partition_hints` (after :func:`.noalias.noalias_where_trivial` and
:func:`.vector_lanes.power_of_two_vectors`) before the whole of it.
"""

from __future__ import annotations

from typing import Any

#: Largest register tile kept on the stack (bytes, exclusive): 24 AVX-512 accumulators (1536 bytes) fit.
STACK_TILE_BYTES = 2048

PIPELINE = "forgekit_cpu"


def constant_bytes(buf: Any) -> int | None:
    """The bytes of a buffer of constant shape (None: a symbolic dimension)."""
    from tvm import tirx

    n = buf.dtype.bits * buf.dtype.lanes // 8
    for s in buf.shape:
        if not isinstance(s, tirx.IntImm):
            return None
        n *= int(s)
    return n


def keep_tiles_on_stack() -> Any:
    """The PrimFunc pass: annotate small constant-size "global" allocations ``disable_lower_builtin``."""
    import tvm_ffi
    from tvm import tirx

    def mark(node: Any) -> Any:
        nbytes = constant_bytes(node.buffer)
        if node.buffer.scope() != "global" or nbytes is None or not 0 < nbytes < STACK_TILE_BYTES \
                or "disable_lower_builtin" in node.annotations:
            return node
        return tirx.AllocBuffer(node.buffer, {**node.annotations, "disable_lower_builtin": tirx.IntImm("int32", 1)})

    def run(func: Any, _mod: Any, _ctx: Any) -> Any:
        return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.AllocBuffer, mark)], order="post"))

    return tirx.transform.prim_func_pass(run, opt_level=0, name="forgekit.KeepTilesOnStack")


#: the loop annotation that asks TVM's LoopPartition pass to split a loop where its conditions change
PARTITION_HINT = "pragma_loop_partition_hint"
INT32_ELEMENTS = 2**31


def narrowable(func: Any) -> bool:
    """Whether :func:`keep_partition_hints` indexes ``func`` in int32: float tensors only (the pass narrows integer
    buffers too), all of static shape under 2^31 elements."""
    for buf in func.params:  # TVM 0.27: the tensors themselves (a scalar parameter has no shape)
        if not hasattr(buf, "shape") or not str(buf.dtype).startswith(("float", "bfloat")):
            return False
        nbytes = constant_bytes(buf)
        if nbytes is None or nbytes * 8 // (buf.dtype.bits * buf.dtype.lanes) >= INT32_ELEMENTS:
            return False
    return True


def hint_partition(sch: Any, loop: Any) -> None:
    """Ask LoopPartition to split ``loop`` (a schedule's LoopRV) where its conditions change, where the hint
    survives the pipeline: in a kernel :func:`keep_partition_hints` narrows, or on a loop of symbolic extent
    (``NarrowDataType`` leaves those in int64).  A static loop in a kernel of symbolic or integer buffers gets
    none: ``NarrowDataType`` narrows it alone and LoopPartition then mixes int32 and int64 ("mismatched types",
    a fuzzer's Slice over a dynamic batch)."""
    from tvm import tirx

    if narrowable(sch.mod["main"]) or not isinstance(sch.get(loop).extent, tirx.IntImm):
        sch.annotate(loop, PARTITION_HINT, 1)


def keep_partition_hints() -> Any:
    """The PrimFunc pass: index a kernel that has a :data:`PARTITION_HINT` loop in int32 while it is still in
    blocks, so that the hint reaches ``LoopPartition``.

    The s_tir pipeline runs ``NarrowDataType(32)`` before ``LoopPartition``; it gives a narrowed int64 loop a
    new variable but leaves the hint's ``AttrStmt`` on the old one, so the hint of every Relax kernel (int64
    indices) was lost and its loop never split (:mod:`.rules.column_reduction`: the ragged-chunk softmax stayed
    scalar).  ``ForceNarrowIndexToInt32`` on the block form keeps the annotation on the loop.  Only kernels
    :func:`narrowable` (:func:`hint_partition` hints no other static loop): a symbolic size keeps int64 here,
    and ``NarrowDataType`` cannot narrow it either, so its hint is not renamed away.  Should TVM refuse to
    narrow one, its static loops lose their hints (the kernel is then scheduled as without them).
    """
    import tvm
    import tvm_ffi
    from tvm import tirx

    def hinted(func: Any) -> bool:
        found = []

        def visit(node: Any) -> Any:
            if PARTITION_HINT in node.annotations:
                found.append(node)
            return node

        tvm_ffi.structural_map(func.body, [(tirx.For, visit)], order="post")
        return bool(found)

    def unhint_static(node: Any) -> Any:
        if PARTITION_HINT not in node.annotations or not isinstance(node.extent, tirx.IntImm):
            return node
        rest = {k: v for k, v in node.annotations.items() if k != PARTITION_HINT}
        return tirx.For(node.loop_var, node.min, node.extent, node.kind, node.body, node.thread_binding, rest,
                        node.step, node.span)

    narrow = tirx.transform.ForceNarrowIndexToInt32()

    def run(func: Any, _mod: Any, _ctx: Any) -> Any:
        if not hinted(func):
            return func
        if narrowable(func):
            try:
                return narrow(tvm.IRModule({"main": func}))["main"]
            except Exception:  # noqa: BLE001 - TVM's check of a constant beyond int32: keep int64, unhinted
                pass
        return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.For, unhint_static)], order="post"))

    return tirx.transform.prim_func_pass(run, opt_level=0, name="forgekit.KeepPartitionHints")


def _factory(**kwargs: Any) -> Any:
    import tvm
    from tvm.tirx import compilation_pipeline

    from .noalias import noalias_where_trivial
    from .vector_lanes import power_of_two_vectors

    pipeline, host, device = compilation_pipeline.PIPELINE_MAP["s_tir"](**kwargs)
    return (tvm.ir.transform.Sequential([noalias_where_trivial(), power_of_two_vectors(), keep_partition_hints(),
                                         pipeline]),
            (lambda: tvm.ir.transform.Sequential([keep_tiles_on_stack(), host()])), device)


def tir_pipeline() -> str:
    """The name of the CPU TIR pipeline, registered with TVM (idempotent) on first use."""
    from tvm.tirx import compilation_pipeline

    if compilation_pipeline.PIPELINE_MAP.get(PIPELINE) is not _factory:
        compilation_pipeline.register_tir_pipeline(PIPELINE, _factory)
    return PIPELINE
