"""Vector loops of a power-of-two number of lanes: no lane computes on memory the loop does not own.

A loop vectorized over an extent that is not a power of two (24 output channels, 40, 12) becomes an LLVM
vector such as ``<24 x float>``, which x86 type legalization *widens* to ``<32 x float>``: the last eight lanes
are undefined, and where the operand is an aligned load LLVM reads them from memory (a 64-byte ``vaddps
0x40(%r12)`` of a 24-float bias reads the 8 floats after it).  Whatever lies there, the lanes go through the
whole computation and are dropped at the store; correct, but where they hold a denormal or NaN pattern every
floating-point operation on them takes a microcode assist on Intel cores (~100+ cycles; the AMD Zen machines of
earlier sessions never showed it).  A SiLU epilogue over 24 channels (the exp polynomial: ~20 operations a
vector) then ran 20x slower: a 1 -> 24 stride-2 conv + SiLU (ddddocr's stem) over 64 x 320 took 0.93 ms in a
build with a dynamic width and 0.043 ms in its static twin, whose library has the same ``<24 x float>`` code
and happened to find harmless bytes (2 threads, an AVX-512 Xeon).  Independent of the input (zeros, ones,
noise alike); with MXCSR's flush-to-zero and denormals-are-zero bits set, 2.08 -> 0.34 ms on one thread; a
24 -> 24 conv + SiLU was bimodal between processes of one script (0.46 or 1.3 ms).

The pass below (first in forgekit's CPU TIR pipeline, on the scheduled kernels) partitions each such loop into
power-of-two parts, largest first (24 = 16 + 8, 40 = 32 + 8, 12 = 8 + 4), each vectorized: every part is a
type LLVM splits into whole registers or holds in a narrower one (``<8 x float>`` is a ymm register on
AVX-512), so no lane is undefined.  Parts under :data:`MIN_LANES` lanes are kept as a serial loop (a ``<2 x
float>`` is widened again).  It uses TVM's own ``loop_partition`` schedule primitive; setting flush-to-zero
instead would change the results of models that compute in denormals, and every thread (the caller's too)
would need it set and restored around each call.
"""

from __future__ import annotations

from typing import Any

#: Fewest lanes a part is vectorized with: x86's narrowest vector register holds four 32-bit lanes.
MIN_LANES = 4


def power_of_two_parts(extent: int) -> list[int]:
    """``extent`` as powers of two, largest first, those under :data:`MIN_LANES` merged into one last part."""
    parts = [1 << b for b in reversed(range(extent.bit_length())) if extent >> b & 1]
    big = [p for p in parts if p >= MIN_LANES]
    rest = extent - sum(big)
    return big + ([rest] if rest else [])


def _irregular(loop: Any) -> bool:
    from tvm import tirx

    if loop.kind != tirx.ForKind.VECTORIZED or not isinstance(loop.extent, tirx.IntImm) or loop.annotations:
        return False
    n = int(loop.extent)
    return n > MIN_LANES and n & (n - 1) != 0


def _has_irregular_loop(func: Any) -> bool:
    import tvm_ffi
    from tvm import tirx

    found = []

    def note(loop: Any) -> Any:
        found.append(_irregular(loop))
        return loop

    tvm_ffi.structural_map(func.body, [(tirx.For, note)], order="post")
    return any(found)


def _split_loops(func: Any) -> Any:
    """``func`` with its irregular vector loops partitioned (unchanged where there is none, where it is not a
    block-structured kernel, e.g. the hand-written recurrent loops, or where TVM refuses)."""
    import tvm
    from tvm import s_tir

    if not _has_irregular_loop(func):
        return func
    try:
        sch = s_tir.Schedule(tvm.IRModule({"main": func}), debug_mask=0)
        root = sch.get_sblock("root")
    except RuntimeError:  # s_tir.ScheduleError is one: a kernel of no blocks (no root block to schedule)
        return func

    def irregular_loops() -> list[Any]:
        found, stack = [], [root]
        while stack:
            block = stack.pop()
            stack.extend(sch.get_child_blocks(block))
            found.extend(loop for loop in sch.get_loops(block) if _irregular(sch.get(loop)))
        return found

    vector_vars = set()
    while loops := irregular_loops():  # one loop a round: partitioning makes the other LoopRVs stale
        parts = power_of_two_parts(int(sch.get(loops[0]).extent))
        try:
            pieces = sch.loop_partition(loops[0], parts[:-1] + [None])
        except s_tir.ScheduleError:
            return func
        # every part of MIN_LANES or more is a power of two (power_of_two_parts)
        vector_vars.update(sch.get(piece).loop_var for piece, lanes in zip(pieces, parts) if lanes >= MIN_LANES)
    # the parts are vectorized as their loop was, by kind: ``sch.vectorize`` would check their dataflow anew and
    # refuse parts of a block it accepted whole (a predicated epilogue, a reduction's init)
    return _vectorize(sch.mod["main"], vector_vars)


def _vectorize(func: Any, loop_vars: set[Any]) -> Any:
    import tvm_ffi
    from tvm import tirx

    def kind(loop: Any) -> Any:
        if loop.loop_var not in loop_vars:
            return loop
        return tirx.For(loop.loop_var, loop.min, loop.extent, tirx.ForKind.VECTORIZED, loop.body,
                        annotations=loop.annotations, step=loop.step)

    return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.For, kind)], order="post"))


def power_of_two_vectors() -> Any:
    """The PrimFunc pass: vector loops of an irregular extent partitioned into power-of-two vector loops."""
    from tvm import tirx

    def run(func: Any, _mod: Any, _ctx: Any) -> Any:
        if func.attrs is None or not func.attrs.get("tirx.is_scheduled", False):
            return func
        return _split_loops(func)

    return tirx.transform.prim_func_pass(run, opt_level=0, name="forgekit.PowerOfTwoVectors")
