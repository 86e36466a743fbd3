"""Pooling / channel-last reductions (max_pool2d, avg_pool2d, global mean over H,W in NHWC).

The reduction runs over outer axes while the innermost output axis (channels) is spatial, so the
reduction loops are hoisted above the channel loop and the channel loop is vectorized; the
remaining spatial loops are fused and parallelized.  Padding producers are inlined (the
out-of-bounds select is cheap next to the loads).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tvm import tirx
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV

from .base import ScheduleRule
from .common import (
    blocks_of,
    epilogue_covers,
    ext,
    is_reduction,
    iter_kinds,
    loops_match_iters,
    parallel_spatial,
    try_inline,
    vectorize_inner,
)

if TYPE_CHECKING:
    from ....targets.isa import IsaInfo


def _channel_last_reduction(sch: Schedule, blk: SBlockRV) -> bool:
    kinds = iter_kinds(sch, blk)
    ns = kinds.count("S")
    if ns < 1 or kinds != "S" * ns + "R" * (len(kinds) - ns) or not loops_match_iters(sch, blk):
        return False
    b = sch.get(blk)
    if not isinstance(b.body, tirx.BufferStore):
        return False
    last = b.body.indices[-1]
    return isinstance(last, tirx.Var) and last.same_as(b.iter_vars[ns - 1].var)


def schedule_channel_last_reduction(sch: Schedule, blk: SBlockRV, lanes: int, epilogue: SBlockRV | None = None) -> None:
    kinds = iter_kinds(sch, blk)
    ns = kinds.count("S")
    loops = sch.get_loops(blk)
    sl, rl = loops[:ns], loops[ns:]
    c = sl[-1]
    ec = ext(sch, c)
    if ec is None:
        # a symbolic window is fine (a global mean over a dynamic image: the loops only bound it); as a row
        # reduction, channels outside the window, it read one float per 512 bytes: 0.14 ms for a 32x40x128
        # mean, 17x the static pool
        raise ValueError("symbolic channel extent")
    vec = lanes if ec % lanes == 0 else (lanes // 2 if ec % (lanes // 2) == 0 else None)
    if vec is not None and ec > vec:
        c_o, c_i = sch.split(c, [None, vec])
        sch.reorder(*sl[:-1], c_o, *rl, c_i)
        outer = sch.fuse(*sl[:-1], c_o)
    elif vec is not None:
        c_i = c
        sch.reorder(*sl[:-1], *rl, c_i)
        outer = sch.fuse(*sl[:-1]) if ns > 2 else sl[0]
    else:
        c_i = None
        outer = sch.fuse(*sl) if ns > 1 else sl[0]
    if ext(sch, outer) is None or ext(sch, outer) > 1:
        sch.parallel(outer)
    if c_i is not None:
        sch.vectorize(c_i)
    if epilogue is not None and epilogue_covers(sch, blk, epilogue):
        sch.reverse_compute_at(epilogue, outer, preserve_unit_loops=False)
        vectorize_inner(sch, epilogue, lanes)
    elif epilogue is not None:  # e.g. a Pad after the pool: its border reads no pool tile
        parallel_spatial(sch, epilogue, lanes)
    if c_i is not None:
        init = sch.decompose_reduction(blk, rl[0])
        lp = sch.get_loops(init)
        sch.vectorize(lp[-1])
    return outer


class PoolRule(ScheduleRule):
    name = "pool"

    def matches(self, sch: Schedule, tinfo: IsaInfo) -> SBlockRV | None:
        blocks = blocks_of(sch)
        red = [b for b in blocks if is_reduction(sch, b)]
        if len(red) != 1 or not _channel_last_reduction(sch, red[0]):
            return None
        return red[0]

    def apply(self, sch: Schedule, blk: SBlockRV, tinfo: IsaInfo, knobs: dict[str, Any] | None = None) -> Schedule:
        lanes = tinfo.vec_lanes
        blocks = blocks_of(sch)
        ridx = [i for i, b in enumerate(blocks) if is_reduction(sch, b)][0]
        for b in blocks[:ridx]:  # padding etc.: inline into the window loads
            if not try_inline(sch, b):
                raise ValueError("producer not inlinable")
        blocks = blocks_of(sch)
        red = [b for b in blocks if is_reduction(sch, b)][0]
        cons = [b for b in blocks if not is_reduction(sch, b)]
        for b in cons[:-1]:
            sch.compute_inline(b)
        schedule_channel_last_reduction(sch, red, lanes, cons[-1] if cons else None)
        return sch
