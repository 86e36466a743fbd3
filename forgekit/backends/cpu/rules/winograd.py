"""Winograd transform kernels (:mod:`..winograd`): the input transform ``winograd_input`` and the output
transform ``winograd_output`` with its fused epilogue (bias, ReLU, residual add).  The GEMM between them is
an ordinary batched matmul for :class:`.matmul.MatmulRule`.

Both transforms select one of alpha^2 (input) or m^2 (output) addition patterns by an index; the schedule unrolls
that index innermost but for the channel vector, so every case folds to a constant pattern and the patch's
vector loads are shared by all the cases::

    input:   parallel for t: for c_o:
                 for i, b in unroll(alpha, alpha): rows[i, b][0:L] = adds of d[i, j][c_o*L : +L]
                 for e in unroll(alpha^2): V[e, t, c_o*L : +L] = adds of rows[i, e % alpha]
    output:  parallel for (n, ty): for tx: for k_o:
                 for a, j in unroll(alpha, m): cols[a, j][0:L] = adds of M[a * alpha + b, t, k_o*L : +L]
                 for i, j in unroll(m, m): Y[...] = epilogue(adds of cols[a, j])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tvm.s_tir import Schedule

from ..winograd import COLS, ROWS, TILE_ATTR
from .base import ScheduleRule
from .common import (MIN_PARALLEL_ELEMS, attach_epilogue, blocks_of, ext, is_reduction, parallel_spatial, position,
                     try_inline)

if TYPE_CHECKING:
    from ....targets.isa import IsaInfo

_INPUT, _OUTPUT = "winograd_input", "winograd_output"


class WinogradRule(ScheduleRule):
    name = "winograd"

    def matches(self, sch: Schedule, tinfo: IsaInfo) -> tuple[str, Any] | None:
        blocks = blocks_of(sch)
        if any(is_reduction(sch, b) for b in blocks):
            return None
        for b in blocks:
            name = sch.get(b).name_hint
            if name in (_INPUT, _OUTPUT):
                return name, b
        return None

    def apply(self, sch: Schedule, match: tuple[str, Any], tinfo: IsaInfo,
              knobs: dict[str, Any] | None = None) -> Schedule:
        name, block = match
        lanes = tinfo.vec_lanes
        blocks = blocks_of(sch)
        idx = position(sch, blocks, block)
        producers, consumers = blocks[:idx], blocks[idx + 1:]
        if name == _INPUT:
            if consumers:
                raise ValueError("the input transform fuses with nothing (op_pattern opaque)")
            anchor = self._input(sch, block, lanes)
        else:
            anchor, row = self._output(sch, block, lanes)
            # bias, ReLU, SiLU, residual add: inlined into the last block, computed per output row of a tile
            # (m pixels x one vector, on the stack) right after the transform writes it
            attach_epilogue(sch, block, consumers, row, "global", lanes)
        for p in producers:
            if sch.get(p).name_hint in (ROWS, COLS):
                # the first pass of the separable transform, per tile and channel vector: alpha^2 (input) or
                # alpha * m (output) vectors, in registers and L1
                sch.compute_at(p, anchor)
                loops = sch.get_loops(p)
                at = position(sch, loops, anchor)
                inner = loops[at + 1:]
                for lp in inner[:-1]:
                    sch.unroll(lp)
                sch.vectorize(inner[-1])
            elif sch.get(p).name_hint == "pad_temp":
                # a padded copy: inlined, its bounds checks would select around vector loads that read
                # outside the input (the crash the int8/bf16 prologues had)
                parallel_spatial(sch, p, lanes)
            elif not try_inline(sch, p):
                parallel_spatial(sch, p, lanes)
        return sch

    @staticmethod
    def _input(sch: Schedule, block: Any, lanes: int) -> Any:
        e, t, c = sch.get_loops(block)
        if (ext(sch, c) or 1) % lanes:
            raise ValueError("channels not whole vectors")
        # 16 cases for F(4x4) too, not its 36: a case is a few adds, and counting 36 made the transforms of 32-
        # and 48-channel convs at 14x14/16x16 parallel and 1.2-1.35x slower per conv (min of 30 alternating
        # blocks, 2 threads: 32ch 16x16 13.5 -> 16.8 us, 48ch 14x14 22.8 -> 30.8 us; 64ch, parallel either way,
        # unchanged)
        # a symbolic tile count (dynamic height/width) counts as large: parallel
        work = (ext(sch, t) or MIN_PARALLEL_ELEMS) * (ext(sch, c) or 0) * 16
        c_o, c_l = sch.split(c, [None, lanes])
        sch.reorder(t, c_o, e, c_l)
        sch.unroll(e)
        sch.vectorize(c_l)
        if work >= MIN_PARALLEL_ELEMS:
            sch.parallel(t)
        return c_o

    @staticmethod
    def _output(sch: Schedule, block: Any, lanes: int) -> tuple[Any, Any]:
        m = int(sch.get(block).annotations.get(TILE_ATTR, 2))
        n, y, x, k = sch.get_loops(block)
        if (ext(sch, k) or 1) % lanes:
            raise ValueError("channels not whole vectors")
        y_o, y_i = sch.split(y, [None, m])
        x_o, x_i = sch.split(x, [None, m])
        k_o, k_l = sch.split(k, [None, lanes])
        sch.reorder(n, y_o, x_o, k_o, y_i, x_i, k_l)
        outer = sch.fuse(n, y_o)
        sch.unroll(y_i)
        sch.unroll(x_i)
        sch.vectorize(k_l)
        total = 1
        for lp in (outer, x_o, k_o):
            total *= ext(sch, lp) or MIN_PARALLEL_ELEMS  # symbolic: large
        if total * m * m * lanes >= MIN_PARALLEL_ELEMS:
            sch.parallel(outer)
        return k_o, y_i
