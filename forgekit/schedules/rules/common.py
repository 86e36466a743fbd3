"""Shared schedule helpers used by the rules."""
from tvm import s_tir, tirx


def ext(sch, loop):
    """Static extent of a loop (None when symbolic)."""
    e = sch.get(loop).extent
    return int(e) if isinstance(e, tirx.IntImm) else None


def blocks_of(sch):
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def iter_kinds(sch, block):
    return "".join({tirx.IterVar.DataPar: "S", tirx.IterVar.CommReduce: "R"}.get(i.iter_type, "O")
                   for i in sch.get(block).iter_vars)


def is_reduction(sch, block):
    return "R" in iter_kinds(sch, block)


def is_output_block(sch, block):
    outs = sch.get_output_blocks(sch.get_sblock("root"))
    return any(sch.get(o).same_as(sch.get(block)) for o in outs)


def loops_match_iters(sch, block):
    """True when the block's loops bind its iter vars 1:1 in order (fresh legalized TIR).
    Extents may be symbolic (dynamic batch); rules check the extents they tile themselves."""
    loops = sch.get_loops(block)
    b = sch.get(block)
    if len(loops) != len(b.iter_vars):
        return False
    return True


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def best_divisor(n, limit):
    return max(d for d in divisors(n) if d <= limit) if n >= 1 else 1


def vectorize_inner(sch, block, lanes, max_vec=None):
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


def parallel_spatial(sch, block, lanes, min_par=2):
    """Parallelize+vectorize a spatial (injective) block: fuse all loops, vectorize inner lanes,
    parallel over the rest."""
    loops = sch.get_loops(block)
    if not loops:
        return
    exts = [ext(sch, l) for l in loops]
    if any(e is None for e in exts):
        # symbolic: just parallelize the outermost loop
        sch.parallel(loops[0])
        return
    inner_e = exts[-1]
    total0 = 1
    for e in exts:
        total0 *= e
    if total0 < MIN_PARALLEL_ELEMS:
        min_par = 1 << 62
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


def try_inline(sch, block):
    try:
        sch.compute_inline(block)
        return True
    except Exception:  # pylint: disable=broad-except
        return False


def try_reverse_inline(sch, block):
    try:
        sch.reverse_compute_inline(block)
        return True
    except Exception:  # pylint: disable=broad-except
        return False


#: TVM 0.27 puts an allocation on the stack only if it is "global" scope and under 1024 bytes
#: (runtime::kMaxStackAlloca); anything else, "local" scope included, is served by a
#: TVMBackendAllocWorkspace/FreeWorkspace pair each time the enclosing loop body runs. For a register
#: tile allocated inside the parallel loop that is two calls per tile: measured 2.5x on a 1x1 int8 conv.
STACK_BYTES = 1024


def acc_scope(nbytes):
    """Storage scope for a per-tile accumulator of ``nbytes``: on the stack (registers after LLVM's
    SROA) when it fits, else "local" (a workspace allocation per tile)."""
    return "global" if nbytes < STACK_BYTES else "local"


def stack_budget(tinfo, lanes=None, elem_bytes=4):
    """Vector accumulators of ``lanes`` (default: the target's fp32 lanes) elements a tile may hold:
    the register budget, capped to fit on the stack."""
    return max(1, min(tinfo.acc_budget, (STACK_BYTES - 1) // ((lanes or tinfo.vec_lanes) * elem_bytes)))
