"""Row reductions: softmax, layer_norm, mean/sum over the innermost axis, fused epilogues.

Every block in the function reduces over (or maps along) the innermost axis of the same rows.
Schedule (as dlight.cpu.Reduction does): inline elementwise producers, fuse the leading row loops
of the output block and parallelize them, compute every other block at that row loop so one row
stays in L1 across max / exp-sum / normalize, and vectorize the spatial inner loops.  A producer that
several blocks read and that costs more than :data:`CHEAP_FLOPS` per element (softmax's exp: 85) is not
inlined but computed once per row, where it stays in cache for its readers: inlined, softmax computed every
exp twice.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any

from tvm import s_tir, tirx
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV

from .base import ScheduleRule
from .common import (
    blocks_of,
    ext,
    is_output_block,
    is_reduction,
    iter_kinds,
    try_inline,
    vectorize_inner,
)

if TYPE_CHECKING:
    from ....targets.isa import IsaInfo


#: FLOPs per element (TVM's estimate) up to which a producer is inlined into all its readers: a subtraction, a
#: pad's select; an exp (85) is computed once per row instead
CHEAP_FLOPS = 8


def _shared_and_costly(sch: Schedule, block: SBlockRV) -> bool:
    """Whether inlining ``block`` would repeat real work: it has several readers and is not cheap."""
    if len(sch.get_consumers(block)) < 2:
        return False
    try:
        return float(s_tir.analysis.estimate_tir_flops(sch.get(block))) > CHEAP_FLOPS
    except Exception:  # noqa: BLE001 - TVM cannot estimate it: inline, as before
        return False


def _non_unit(extents: Any) -> collections.Counter:
    """The extents other than 1 (a symbolic one by its expression), counted."""
    out: collections.Counter = collections.Counter()
    for e in extents:
        if not (isinstance(e, tirx.IntImm) and int(e) == 1):
            out[int(e) if isinstance(e, tirx.IntImm) else str(e)] += 1
    return out


def row_loops(sch: Schedule, red: list[SBlockRV], out: SBlockRV) -> int | None:
    """How many leading loops of the output make one row: those over the axes the reductions keep.

    All but the innermost for a row reduction over the last axis; fewer when the reductions reduce trailing axes
    too (a LayerNorm over [H, W]: the row is one (n, c), reduced over H x W).  None when a kept axis comes after
    a reduced one: a column reduction (softmax over a middle axis) that
    :class:`.column_reduction.ColumnReductionRule` left (a short innermost axis, a symbolic reduced one).  Its
    rows (every loop but the innermost) ran each reduction again for every row sharing its result: a
    [1, 256, 32, 8] softmax over its 256 channels took 60 ms (onnxruntime 1.4); the fallback rule computes each
    block once (0.66 ms), and a LayerNorm over [32, 64] went 0.26 -> 0.025 ms with its row over (n, c).
    """
    loops = sch.get_loops(out)
    if is_reduction(sch, out):
        return iter_kinds(sch, out).count("S")
    rows = len(loops) - 1
    for b in red:
        kept = _non_unit([iv.dom.extent for iv in sch.get(b).iter_vars if iv.iter_type == tirx.IterVar.DataPar])
        lead = 0
        for count in (_non_unit([sch.get(lp).extent]) for lp in loops[:-1]):
            if count and not count - kept:  # a kept axis (a unit one counts as nothing)
                kept -= count
            elif count:
                break  # a reduced axis: the row ends here
            lead += 1
        if +kept:
            return None
        rows = min(rows, lead)
    return rows


class ReductionRule(ScheduleRule):
    name = "reduction"

    def matches(self, sch: Schedule, tinfo: IsaInfo) -> tuple[list[SBlockRV], int] | None:
        blocks = blocks_of(sch)
        red = [b for b in blocks if is_reduction(sch, b)]
        if not red:
            return None
        for b in red:
            k = iter_kinds(sch, b)
            ns = k.count("S")
            if k != "S" * ns + "R" * (len(k) - ns):
                return None
        rows = row_loops(sch, red, blocks[-1])
        return (red, rows) if rows else None

    def apply(self, sch: Schedule, match: tuple[list[SBlockRV], int], tinfo: IsaInfo,
              knobs: dict[str, Any] | None = None) -> Schedule:
        nlead = match[1]
        lanes = tinfo.vec_lanes
        for b in blocks_of(sch):
            if not is_reduction(sch, b) and not is_output_block(sch, b) and not _shared_and_costly(sch, b):
                try_inline(sch, b)
        # vectorize row reductions: k -> (ko, ki=lanes), rfactor ki into a lanes-wide partial
        # accumulator (vector max/sum), then a short serial reduction of the lanes
        rf_blocks = []
        for name in [sch.get(b).name_hint for b in blocks_of(sch) if is_reduction(sch, b)]:
            b = sch.get_sblock(name)
            if is_output_block(sch, b):
                continue
            k = sch.get_loops(b)[-1]
            e = ext(sch, k)
            if iter_kinds(sch, b)[-1] != "R" or e is None or e % lanes or e < 2 * lanes:
                continue
            _, ki = sch.split(k, [None, lanes])
            rf_blocks.append(sch.rfactor(ki, factor_axis=0))
        blocks = blocks_of(sch)
        out = blocks[-1]
        loops = sch.get_loops(out)
        row = sch.fuse(*loops[:nlead]) if nlead > 1 else loops[0]
        for b in reversed(blocks[:-1]):
            sch.compute_at(b, row, preserve_unit_loops=True)
        if ext(sch, row) is None or ext(sch, row) > 1:
            sch.parallel(row)
        for rf in rf_blocks:
            # compute_at regenerates loops in block-iter order: (ki, ..., ko); put ki innermost
            lps = sch.get_loops(rf)[1:]
            ko = lps[-1]
            ki = [l for l in lps[:-1] if ext(sch, l) == lanes][0]
            sch.reorder(ko, ki)
            sch.vectorize(ki)
            init = sch.decompose_reduction(rf, ko)
            sch.vectorize(sch.get_loops(init)[-1])
        for b in blocks_of(sch):
            if not is_reduction(sch, b) and not sch.get(b).name_hint.endswith("_init"):
                vectorize_inner(sch, b, lanes)
        return sch
