"""Shared schedule helpers used by the rules."""

from __future__ import annotations

from typing import Any

import tvm_ffi
from tvm import tirx
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import LoopRV, SBlockRV

from ..stack_tiles import hint_partition, narrowable
from ..tiling import acc_scope, best_divisor, divisors, stack_budget  # noqa: F401 - re-exported


def ext(sch: Schedule, loop: LoopRV) -> int | None:
    """Static extent of a loop (None when symbolic)."""
    e = sch.get(loop).extent
    return int(e) if isinstance(e, tirx.IntImm) else None


def multiple_of(extent: Any, lanes: int) -> bool:
    """Whether a (symbolic) extent is provably a multiple of ``lanes`` (``(S + 15) // 16 * 16``)."""
    import tvm

    return bool(tvm.sym.Analyzer().can_prove(tirx.floormod(extent, lanes) == 0))


def blocks_of(sch: Schedule) -> list[SBlockRV]:
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def position(sch: Schedule, rvs: list[Any], target: Any) -> int:
    """Where ``target`` (a block or loop RV) is in ``rvs``, compared by the schedule object it stands for."""
    obj = sch.get(target)
    return next(i for i, rv in enumerate(rvs) if sch.get(rv).same_as(obj))


def iter_kinds(sch: Schedule, block: SBlockRV) -> str:
    return "".join({tirx.IterVar.DataPar: "S", tirx.IterVar.CommReduce: "R"}.get(i.iter_type, "O")
                   for i in sch.get(block).iter_vars)


def is_reduction(sch: Schedule, block: SBlockRV) -> bool:
    return "R" in iter_kinds(sch, block)


def is_output_block(sch: Schedule, block: SBlockRV) -> bool:
    outs = sch.get_output_blocks(sch.get_sblock("root"))
    return any(sch.get(o).same_as(sch.get(block)) for o in outs)


def loops_match_iters(sch: Schedule, block: SBlockRV) -> bool:
    """True when the block's loops bind its iter vars 1:1 in order (fresh legalized TIR).
    Extents may be symbolic (dynamic batch); rules check the extents they tile themselves."""
    loops = sch.get_loops(block)
    b = sch.get(block)
    if len(loops) != len(b.iter_vars):
        return False
    return True


def vectorize_inner(sch: Schedule, block: SBlockRV, lanes: int, max_vec: int | None = None) -> None:
    """Vectorize (part of) the innermost loop of `block` if the extent allows it."""
    loops = sch.get_loops(block)
    if not loops:
        return
    inner = loops[-1]
    # After compute_at/reverse_compute_at the block's innermost loop may be a shared outer loop
    # (e.g. the fused loop of a reduction and its epilogue). Vectorizing that loop would vectorize
    # the sibling's serial reduction too, which TVM lowers to wrong code: only vectorize a loop
    # that holds this block alone.
    if len(sch.get_child_blocks(inner)) != 1:
        return
    e = ext(sch, inner)
    if e is None or e <= 1:
        return
    if e % lanes == 0 and e > lanes:
        _, vi = sch.split(inner, [None, lanes])
        sch.vectorize(vi)
    elif e <= lanes * 4:
        sch.vectorize(inner)
    else:
        d = best_divisor(e, lanes)
        if d > 1:
            _, vi = sch.split(inner, [None, d])
            sch.vectorize(vi)


# Below this many output elements a kernel runs single-threaded: a parallel region costs a
# fork/join (a few us, much more when the machine is oversubscribed and a worker is descheduled).
MIN_PARALLEL_ELEMS = 16384

#: What a symbolic extent (a dynamic width, a sequence length) counts as when deciding whether a kernel
#: is big enough to run in parallel: sizes are dynamic because they are large.
SYMBOLIC_GUESS = 64


def parallel_spatial(sch: Schedule, block: SBlockRV, lanes: int, min_par: int = 2) -> None:
    """Parallelize+vectorize a spatial (injective) block: fuse all loops, vectorize inner lanes,
    parallel over the rest."""
    loops = sch.get_loops(block)
    if not loops:
        return
    exts = [ext(sch, l) for l in loops]
    if any(e is None for e in exts):
        # symbolic: one parallel loop over the axes up to the first symbolic one (parallelizing only the
        # outermost would run a batch of 1 on one core; fusing a symbolic axis with the axes inside it
        # makes index splits TVM's lowering cannot prove), vector lanes over a static innermost axis
        first = exts.index(None)
        if first == len(loops) - 1 and first and multiple_of(sch.get(loops[-1]).extent, lanes):
            # only the innermost axis is symbolic, rounded up to whole vectors (a zero-padded copy
            # feeding a dynamic matmul): vector lanes over it, parallel over the static axes.  Fusing it
            # into the parallel loop cost three 64-bit divisions per scalar element: attention's
            # [4, 64, S] -> [4, 64, round_up(S, 16)] copy took 29 us at S=16, now 2 us (15 us at S=128)
            _, vi = sch.split(loops[-1], [None, lanes])
            sch.vectorize(vi)
            outer = sch.fuse(*loops[:-1]) if first > 1 else loops[0]
            if ext(sch, outer) > 1:
                sch.parallel(outer)
            return
        if first == len(loops) - 1 and first:
            # only the innermost axis is symbolic (an NHWC -> NCHW output of a dynamic-width conv net, a
            # dynamic length's last axis): fused into the parallel loop, every element paid two 64-bit
            # divisions by it to find its row.  Parallel over the static rows, the symbolic axis a plain loop
            # inside (LLVM vectorizes it where it reads contiguously)
            static = 1
            for e in exts[:first]:
                static *= e
            outer = sch.fuse(*loops[:first]) if first > 1 else loops[0]
            sch.parallel(outer if static >= 2 else loops[-1])
            return
        if first < len(loops) - 1 and exts[-1] is not None and exts[-1] % lanes == 0:
            _, vi = sch.split(loops[-1], [None, lanes])
            sch.vectorize(vi)
        if first == 0 and len(loops) > 2 and _parallel_inside_batch(sch, loops, exts):
            return
        sch.parallel(sch.fuse(*loops[:first + 1]) if first else loops[0])
        return
    total0 = 1
    for e in exts:
        total0 *= e
    # whether a ragged innermost axis may take _ragged_rows (below): fusing loops changes none of this
    ragged = bool(total0 % lanes) and narrowable(sch.mod["main"]) and not _reads_flat(sch.get(block))
    if exts[-1] < lanes and len(loops) >= 3:
        # whole vectors per row, or enough of them that the cut one is a small part (ragged rows)
        loops, exts = _fuse_contiguous_tail(sch, block, loops, exts, lanes,
                                            lambda span: span % lanes == 0 or (ragged and span >= 4 * lanes))
    inner_e = exts[-1]
    if total0 < MIN_PARALLEL_ELEMS:
        min_par = 1 << 62
    if _tiled_transpose(sch, block, loops, exts, lanes, total0 >= MIN_PARALLEL_ELEMS):
        return
    # split the innermost axis first so vector lanes index it as a clean ramp (fusing first gives
    # floormod(fused*16 + lane, C), which defeats vector loads); when it is not a multiple of the lanes
    # (e.g. 24 channels with 16 lanes) use 8- or 4-lane vectors over it: vectorizing the fused index
    # instead turns every per-channel operand (scale, bias) into a 16-lane gather (10x slower)
    width = lanes if inner_e % lanes == 0 else next(
        (d for d in (lanes // 2, lanes // 4) if inner_e > lanes and d >= 4 and inner_e % d == 0), None)
    if width:
        c_o, vi = sch.split(loops[-1], [None, width])
        o = sch.fuse(*loops[:-1], c_o) if len(loops) > 1 else c_o
        sch.vectorize(vi)
        if ext(sch, o) >= min_par:
            sch.parallel(o)
        return
    if inner_e > lanes and ragged:
        _ragged_rows(sch, loops, lanes, total0 >= MIN_PARALLEL_ELEMS)
        return
    total = 1
    for e in exts:
        total *= e
    if total < MIN_PARALLEL_ELEMS:
        min_par = 1 << 62
    if inner_e < lanes and len(loops) >= 3 and total >= MIN_PARALLEL_ELEMS:
        # tiny innermost axis (e.g. NCHW->NHWC input transpose with C=3): vectorizing the fused
        # index gives div/mod gathers; keep plain loops, unroll the small axis, parallel outside
        outer = sch.fuse(*loops[:-2]) if len(loops) > 3 else loops[0]
        sch.unroll(loops[-1])
        if ext(sch, outer) >= 2:
            sch.parallel(outer)
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    if total % lanes == 0 and total >= lanes * 2:
        o, vi = sch.split(fused, [None, lanes])
        sch.vectorize(vi)
        sch.parallel(o)
    elif total >= min_par:
        sch.parallel(fused)


#: rows of a transposed tile (the transposed axis), each one vector of the output's innermost axis: 8 and 16 timed
#: alike on Zen 3 (within 10 %, both ways), and 8 takes more shapes
TRANSPOSE_TILE = 8


def _transposed_axis(block: Any, exts: list[int]) -> int | None:
    """The loop over the innermost axis of a read of ``block`` that the output does not keep innermost: the ``c``
    of an NHWC -> NCHW ``y[n, c, h, w] = x[n, h, w, c]`` or the ``d`` of attention's ``k^T[b, h, d, s] =
    k[b, h, s, d]``.  None when every read is contiguous along the output's innermost axis (or a broadcast), the
    read indices are not plain loop variables (a reshape in between), or that axis is no whole number of tiles."""
    ivars = [iv.var for iv in block.iter_vars]
    if len(ivars) != len(exts) or any(
            not isinstance(iv.dom.extent, tirx.IntImm) or int(iv.dom.extent) != e
            for iv, e in zip(block.iter_vars, exts)):
        return None
    for read in block.reads:
        last = read.region[-1].min if read.region else None
        if not isinstance(last, tirx.Var) or last.same_as(ivars[-1]) or len(read.region) < 2:
            continue
        if not any(r.min.same_as(ivars[-1]) for r in read.region[:-1]):
            continue  # a broadcast along the output's innermost axis
        axis = next((i for i, v in enumerate(ivars) if v.same_as(last)), None)
        if axis is not None and exts[axis] % TRANSPOSE_TILE == 0:
            return axis
    return None


def _tiled_transpose(sch: Schedule, block: SBlockRV, loops: list[LoopRV], exts: list[int], lanes: int,
                     parallel: bool) -> bool:
    """Schedule a transposing read in tiles (see :func:`_transposed_axis`); False, untouched, when there is none.

    Fused and vectorized along the output's innermost axis, such a kernel read one float per cache line, and the
    next float of each line only after a sweep over the rest of the input.  Here :data:`TRANSPOSE_TILE` rows of
    the transposed axis, each one vector of the innermost, run innermost: the lines a vector loads serve the next
    rows.  A cut last vector (55 pixels) is split off by LoopPartition (the hint, as in :func:`_ragged_rows`).
    Measured alone, with a ReLU fused on either side (Zen 3, 2 threads, interleaved, min of 7 x 30 calls, before
    -> after): NHWC -> NCHW [1, 56, 56, 64] 0.154 -> 0.042 ms and [1, 55, 55, 64] 0.143 -> 0.036, attention's
    [1, 12, 197, 64] -> [1, 12, 64, 197] 0.204 -> 0.033, a YOLO head's [1, 84, 8400] -> [1, 8400, 84] 0.298 ->
    0.157, [4, 128, 96] -> [4, 96, 128] 0.019 -> 0.012; NCHW -> NHWC [1, 64, 56, 56] 0.048 -> 0.043."""
    axis = _transposed_axis(sch.get(block), exts)
    if axis is None or exts[-1] < lanes or len(loops) < 2:
        return False
    ragged = exts[-1] % lanes != 0
    if ragged and not narrowable(sch.mod["main"]):
        return False  # the hint needs int32 indices: the cut vector would predicate every one
    a_o, a_i = sch.split(loops[axis], [None, TRANSPOSE_TILE])
    b_o, b_i = sch.split(loops[-1], [None, lanes])
    outer = [a_o if i == axis else lp for i, lp in enumerate(loops[:-1])]
    sch.reorder(*outer, b_o, a_i, b_i)
    if ragged:
        hint_partition(sch, b_o)
    sch.vectorize(b_i)
    fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    if parallel and ext(sch, fused) > 1:
        sch.parallel(fused)
    return True


def _parallel_inside_batch(sch: Schedule, loops: list[LoopRV], exts: list[int | None]) -> bool:
    """A symbolic outermost axis (a dynamic batch): the parallel loop goes inside it, over the static axes that
    follow (fused) or the next symbolic one (a dynamic height), so that a batch of 1 still runs on every core.
    Parallel over the batch alone, every injective kernel of a dynamic-batch model ran on one core at batch 1:
    NudeNet 320n (batch, height and width dynamic; concatenations, splits, resizes) runs 1.115x faster whole at
    1x3x320x320, 1.04x at 2x3x640x480 (A/B in one process, 2 threads, Zen 3).  False (nothing done) when the
    static work per batch item is too small to share."""
    nxt = next((i for i in range(1, len(loops) - 1) if exts[i] is None), len(loops) - 1)
    span = loops[1:nxt] if nxt > 1 else loops[1:2]
    static = 1
    for e in exts[1:]:
        static *= e or 1
    if nxt > 1 and static < MIN_PARALLEL_ELEMS:
        return False
    sch.parallel(sch.fuse(*span) if len(span) > 1 else span[0])
    return True


def _fuse_contiguous_tail(sch: Schedule, block: SBlockRV, loops: list[LoopRV], exts: list[int], lanes: int,
                          worth: Any) -> tuple[list[LoopRV], list[int]]:
    """The innermost axes fused into one of a vector or more (``worth(extent)``), when every buffer the block
    reads or writes takes them whole and in order, or not at all (a broadcast): a per-channel bias or scale
    over an NCHW map narrower than a vector (13 x 13 on AVX-512).  One axis narrower than the vector is left to
    the caller's small-axis path, which unrolls it with no vector code; over the fused axis the lanes read flat
    ramps.  Measured (AVX-512 Xeon, 2 threads, min of 7 x 500 calls, whole single-op models, before -> after):
    a bias over [1, 255, 13, 13] 16.5 -> 8.1 us, over [2, 32, 8, 6] 7.4 -> 3.6 us; fused, rows of 3 vectors and
    a cut one ([1, 512, 7, 7]) were slower (9.7 -> 13.8 us), and a total of whole vectors, which the fused
    loop takes with a division per lane for the bias ([8, 512, 7, 7]), much slower (16.9 -> 206 us): those
    keep the small-axis path."""
    node = sch.get(block)
    ivars = [iv.var for iv in node.iter_vars]
    n, span = 1, exts[-1]
    while span < lanes and n < len(loops) - 1:
        n, span = n + 1, span * exts[-n - 1]
    if span < lanes or len(ivars) != len(exts) or not worth(span):
        return loops, exts
    tail = ivars[-n:]

    def whole_or_none(access: Any) -> bool:
        region, shape = access.region, access.source.shape
        if any(any(r.min.same_as(v) for v in tail) for r in region[:-n]) or len(region) < n:
            return False  # a tail variable in a leading axis: a transpose, not a flat ramp
        mins = [r.min for r in region[-n:]]
        if all(isinstance(m, tirx.IntImm) for m in mins):
            return True  # a broadcast over the tail
        return all(m.same_as(v) and isinstance(d, tirx.IntImm) and int(d) == e and int(r.extent) == 1
                   for m, v, d, e, r in zip(mins, tail, shape[-n:], exts[-n:], region[-n:]))

    if not all(whole_or_none(a) for a in (*node.reads, *node.writes)):
        return loops, exts
    return loops[:-n] + [sch.fuse(*loops[-n:])], exts[:-n] + [span]


def _reads_flat(block: Any) -> bool:
    """Whether every read of ``block`` is at its own index: the fused loop then indexes every buffer as one flat
    ramp, whatever the innermost extent."""
    return all(_reads_at_own_index(block, r.source) for r in block.reads)


def _ragged_rows(sch: Schedule, loops: list[LoopRV], lanes: int, parallel: bool) -> None:
    """Vector lanes over an innermost axis of no whole number of vectors (a YOLO head's 3549 anchors at
    416x416, an RGB output 55 pixels wide) that a transpose, a slice or a broadcast reads at other indices,
    when the elements in all are no whole number of vectors either.

    The fused loop then did not vectorize at all: NudeNet 320n's box decoding over [1, 22, 3549] at 416x416
    took 0.17 ms, 0.04 ms now (the same model's concatenation of its [1, 18, 3549] scores 0.55 -> 0.44).
    Here the lanes run along the innermost axis, and TVM's LoopPartition (the hint) splits off each row's
    cut vector, as in :mod:`.column_reduction`.  The rows are the parallel loop; a single row ([1, 1, 3549])
    is parallel over its vectors, the chunk index outermost.  Not taken when the total is whole vectors: the
    fused loop vectorizes those, with a division per lane, and the [1, 64, 3549] concatenation of the same
    model ran 0.76 ms that way against 4.8 ms in rows."""
    c_o, vi = sch.split(loops[-1], [None, lanes])
    sch.vectorize(vi)
    rows = 1
    for lp in loops[:-1]:
        rows *= ext(sch, lp)
    if rows > 1:
        outer = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
        hint_partition(sch, c_o)
    else:
        if len(loops) > 1:
            sch.reorder(c_o, *loops[:-1])
        outer = sch.fuse(c_o, *loops[:-1]) if len(loops) > 1 else c_o
        hint_partition(sch, outer)
    if parallel and ext(sch, outer) > 1:
        sch.parallel(outer)


def _attempt(primitive: Any, block: SBlockRV) -> bool:
    """Apply a schedule primitive that may legitimately not apply; whether it did."""
    try:
        primitive(block)
        return True
    except Exception:  # noqa: BLE001 - TVM's ScheduleError and friends: "not applicable here"
        return False


def try_inline(sch: Schedule, block: SBlockRV) -> bool:
    return _attempt(sch.compute_inline, block)


def try_reverse_inline(sch: Schedule, block: SBlockRV) -> bool:
    return _attempt(sch.reverse_compute_inline, block)






def _numel(shape: Any) -> int | None:
    n = 1
    for d in shape:
        if not isinstance(d, tirx.IntImm):
            return None
        n *= int(d)
    return n


def epilogue_covers(sch: Schedule, main: SBlockRV, last: SBlockRV) -> bool:
    """Whether ``reverse_compute_at(last, <a tile loop of main>)`` computes *every* element of ``last``.

    TVM computes, per tile, the elements of ``last`` that read the tile; an element that reads none of
    ``main`` (a Pad's border, the other half of a Concat) is never computed and the output holds garbage
    (forgekit.testing found it: MatMul -> Pad, tests/assets/fuzz/matmul_pad_epilogue_wrong_o3.onnx).  True
    for an output of ``main``'s shape, or a smaller one (a slice, a transpose) read without a condition."""
    produced, written = sch.get(main).writes[0].source, sch.get(last).writes[0].source
    if len(produced.shape) == len(written.shape) and all(
            tvm_ffi.structural_equal(a, b) for a, b in zip(produced.shape, written.shape)):
        return True
    text = sch.get(last).script() if hasattr(sch.get(last), "script") else str(sch.get(last))
    if "if_then_else" in text or "Select" in text:
        return False
    n_in, n_out = _numel(produced.shape), _numel(written.shape)
    if n_in is None or n_out is None:
        # symbolic extents, e.g. a kernel computed on rows rounded up to its tile (tiling.round_up)
        # and sliced back: TVM's analyzer cannot prove ``W <= ceil(W / 8) * 8``, so ask instead that
        # every element of ``last`` reads ``main`` at its own index
        return _reads_at_own_index(sch.get(last), produced)
    return n_out <= n_in


def _reads_at_own_index(block: Any, buffer: Any) -> bool:
    """Whether ``block`` reads ``buffer`` only at the block's own (spatial) index, one element each."""
    ivars = [iv.var for iv in block.iter_vars]
    regions = [r for r in block.reads if r.source.same_as(buffer)]
    return bool(regions) and all(
        len(r.region) == len(ivars) and all(
            rng.min.same_as(v) and isinstance(rng.extent, tirx.IntImm) and int(rng.extent) == 1
            for rng, v in zip(r.region, ivars))
        for r in regions)


def attach_epilogue(sch: Schedule, main: SBlockRV, consumers: list[SBlockRV], outer: LoopRV, scope: str,
                    lanes: int) -> None:
    """Inline the elementwise chain after ``main`` into its last block and compute that per tile of
    ``outer`` (``main``'s result then lives in ``scope``: registers/stack); when the last block does not
    cover its output from the tiles (:func:`epilogue_covers`) it runs after the tiles as its own loop nest."""
    for c in consumers[:-1]:
        sch.compute_inline(c)
    last = consumers[-1] if consumers else None
    if last is not None and epilogue_covers(sch, main, last):
        sch.set_scope(main, 0, scope)
        sch.reverse_compute_at(last, outer, preserve_unit_loops=False)
        vectorize_inner(sch, last, lanes)
        return
    wb = sch.cache_write(main, 0, scope)
    sch.reverse_compute_at(wb, outer, preserve_unit_loops=False)
    vectorize_inner(sch, wb, lanes)
    if last is not None:
        parallel_spatial(sch, last, lanes)
