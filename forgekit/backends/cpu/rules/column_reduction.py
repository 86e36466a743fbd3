"""Column reductions: softmax, sum, max, mean over an axis that is *not* the innermost one.

YOLOv8's distribution-focal-loss head takes ``Softmax(axis=1)`` of a ``[1, 16, 4, A]`` tensor (16 bins,
A = 2100 anchors at 320x320).  :class:`.reduction.ReductionRule` schedules every reduction as a row
reduction: one parallel loop over the kept axes and the reduced axis innermost, so each step reads 16
values 33 KB apart and nothing vectorizes.  That kernel took 7.9-10 ms of a 15 ms model (measured alone,
2 threads).  Here the reduced axis moves *outside* a chunk of the contiguous trailing axis instead: per
chunk of 64 anchors, ``for k in 16: m[0:64] = max(m[0:64], x[k, 0:64])`` and the same for the exp-sum
and the normalization, so every load is a contiguous vector and one chunk (16 x 64 floats) stays in L1:
0.11 ms, the same values.

Matches a fused function with an elementwise output whose reduction blocks all reduce over axes that are
followed by a kept axis (``keepdims`` intermediates of the same rank as the output, the reduced extents
static; the innermost may be symbolic: a dynamic-size detector's anchors, in chunks whose cut last one runs
in a loop of its own (NudeNet's softmax at 128x128 took 1.04 ms as a row reduction, 15 % of the model), and so
may the other kept axes: a dynamic batch, which took NudeNet's softmax to the row rule with its reductions
computed once per bin, 8.2 ms at 320x320); anything else goes on (a lone ``ReduceSum(axis=1)`` is a pooling
window to :class:`.pool.PoolRule`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV

from ..stack_tiles import hint_partition
from .base import ScheduleRule
from .common import blocks_of, ext, is_reduction, iter_kinds, try_inline

if TYPE_CHECKING:
    from ....targets.isa import IsaInfo

#: contiguous elements per chunk: 4 vectors (64 floats with AVX-512); a 16-bin softmax chunk is 4 KB
CHUNK_VECTORS = 4


def _extents(buffer: Any) -> list[int | None]:
    """The buffer's extents, a symbolic one as None: the anchors of a dynamic-size detector (innermost, in
    predicated chunks) or a dynamic batch (a kept axis); the reduced axes must be static."""
    dims: list[int | None] = []
    for s in buffer.shape:
        try:
            dims.append(int(s))
        except TypeError:  # a symbolic extent
            dims.append(None)
    return dims


class ColumnReductionRule(ScheduleRule):
    name = "column_reduction"

    def matches(self, sch: Schedule, tinfo: IsaInfo) -> list[int] | None:
        blocks = blocks_of(sch)
        red = [b for b in blocks if is_reduction(sch, b)]
        out = blocks[-1]
        if not red or is_reduction(sch, out):  # a reduction as the output is a pooling window (PoolRule)
            return None
        out_shape = _extents(sch.get(out).writes[0].source)
        if len(out_shape) < 2:
            return None
        reduced: set[int] = set()
        for b in red:
            kinds = iter_kinds(sch, b)
            ns = kinds.count("S")
            if kinds != "S" * ns + "R" * (len(kinds) - ns):
                return None
            shape = _extents(sch.get(b).writes[0].source)
            if len(shape) != len(out_shape) or shape[-1] != out_shape[-1]:
                return None  # the innermost axis is reduced (a row reduction)
            if any((r is None) != (o is None) for r, o in zip(shape, out_shape)):
                return None  # a symbolic axis reduced, or a reduction of another shape
            axes = {i for i, (r, o) in enumerate(zip(shape[:-1], out_shape[:-1])) if r == 1 and o is not None and o > 1}
            if not axes:
                return None
            reduced |= axes
        if out_shape[-1] is not None and out_shape[-1] < tinfo.vec_lanes:
            return None  # too short to vectorize
        return sorted(reduced)

    def apply(self, sch: Schedule, reduced: list[int], tinfo: IsaInfo,
              knobs: dict[str, Any] | None = None) -> Schedule:
        blocks = blocks_of(sch)
        for b in blocks[:-1]:  # fold single-use elementwise steps (x - max) into their consumer; exp stays
            if not is_reduction(sch, b) and len(sch.get_consumers(b)) == 1:
                try_inline(sch, b)
        blocks = blocks_of(sch)
        out = blocks[-1]
        loops = sch.get_loops(out)
        spatial = loops
        chunk = tinfo.vec_lanes * CHUNK_VECTORS
        inner = ext(sch, spatial[-1])
        inner_o, inner_i = sch.split(spatial[-1], [None, chunk]) if inner is None or inner > chunk \
            else (None, spatial[-1])
        kept = [lp for i, lp in enumerate(spatial[:-1]) if i not in reduced]
        # a last chunk that is cut short (2100 anchors in chunks of 32) puts a predicate on every block, and
        # TVM's VectorizeLoop then scalarizes them all, in every chunk: the softmax [1, 16, 4, 2100] over axis
        # 1 took 0.35 ms alone against 0.06 at 2112 anchors.  With the chunk index outermost in the parallel
        # loop, the cut chunks are its last iterations, and TVM's LoopPartition pass (asked by the hint; see
        # stack_tiles.keep_partition_hints) splits them off into a loop of their own, so the full chunks
        # vectorize without a predicate: 0.35 -> 0.074 ms; [1, 64, 8400] over axis 1 1.7 -> 0.24 ms
        # (onnxruntime 1.0); NudeNet 320n built with dynamic H/W 0.44 -> 0.18 ms at 320x320.  (The schedule
        # primitive loop_partition cannot do this: it takes a loop with a single child, TVM 0.27.)
        ragged = inner_o is not None and (inner is None or inner % chunk != 0)
        chunks = [inner_o] if inner_o is not None else []
        axis_loops = [lp for i, lp in enumerate(spatial[:-1]) if i in reduced]
        if ragged and any(ext(sch, lp) is None for lp in kept):
            # LoopPartition cannot find the cut in a chunk index fused with a symbolic batch (it would divide
            # by it): the chunks alone are the parallel loop, the kept axes run inside each
            sch.reorder(*chunks, *kept, *axis_loops, inner_i)
            par = chunks[0]
            at = sch.fuse(*kept) if len(kept) > 1 else kept[0]
        else:
            outer = chunks + kept if ragged else kept + chunks
            sch.reorder(*outer, *axis_loops, inner_i)
            par = at = sch.fuse(*outer) if len(outer) > 1 else outer[0]
        if ext(sch, par) is None or ext(sch, par) > 1:
            sch.parallel(par)
        if ragged:
            hint_partition(sch, par)
        for b in reversed(blocks[:-1]):
            sch.compute_at(b, at, preserve_unit_loops=True)
        for b in blocks_of(sch):
            if is_reduction(sch, b):
                self._reduction_outside(sch, b, at)
        for b in blocks_of(sch):  # contiguous lanes; a reduction's update may refuse (TVM's dataflow check)
            loop = sch.get_loops(b)[-1]
            if ext(sch, loop) is not None and ext(sch, loop) <= chunk:
                try:
                    sch.vectorize(loop)
                except Exception:  # noqa: BLE001 - LLVM still vectorizes the plain loop
                    pass
        return sch

    @staticmethod
    def _reduction_outside(sch: Schedule, block: SBlockRV, par: Any) -> None:
        """Under ``par``: the reduction loops first, the contiguous spatial loops inside, then the init split off."""
        loops = sch.get_loops(block)
        start = [sch.get(lp).same_as(sch.get(par)) for lp in loops].index(True) + 1
        below = loops[start:]
        n_red = iter_kinds(sch, block).count("R")
        red, sp = below[len(below) - n_red:], below[:len(below) - n_red]
        if sp:
            sch.reorder(*red, *sp)
        sch.decompose_reduction(block, red[0])
