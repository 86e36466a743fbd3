"""Integer conv2d/matmul rule: the register-tiled micro-kernel of ``tiled.py`` with a dot-product
instruction (``vpdpbusd`` on AVX512-VNNI, ``sdot`` on ARMv8.2; see :mod:`forgekit.schedules.int8`).

Matches the blocks made by :mod:`forgekit.schedules.int8` (``conv2d_nhwc_int8`` / ``matmul_int8``):
spatial ``[..., r, v]`` and reduction ``[..., c, i]`` with ``i`` the 4 bytes of one dot product.
Schedule, for ``L`` lanes (16 VNNI, 4 sdot)::

    parallel for (v_o, <other spatial>, r_o):
        acc[rt][vt] = 0                              # local -> vector registers
        for <reductions except i>:
            for r_i in unroll(rt): for v_n in unroll(vt/L):
                acc[r_i][v_n] = dot(acc[r_i][v_n], bcast(x[4 bytes]), w[4L bytes])
        epilogue (-offset*sum(W) fix-up, dequantize, bias, relu, requantize of the next layer)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV

from .. import int8
from .base import ScheduleRule
from .common import (
    SYMBOLIC_GUESS,
    acc_scope,
    attach_epilogue,
    best_divisor,
    blocks_of,
    ext,
    is_reduction,
    iter_kinds,
    parallel_spatial,
    stack_budget,
    vectorize_inner,
)
from .tiled import MIN_PARALLEL_MACS

if TYPE_CHECKING:
    from ....targets.isa import IsaInfo

BLOCKS = ("conv2d_nhwc_int8", "matmul_int8")


def choose_int8_tile(nvec: int, er: int | None, budget: int) -> tuple[int, int]:
    """(vectors per row ``nv``, rows ``rt``) of the accumulator tile: ``nv`` divides the ``nvec`` output
    vectors, ``rt`` the row extent ``er``, ``nv * rt <= budget``; maximizes vpdpbusd per load
    (``nv * rt`` dot products per ``nv`` weight loads + ``rt`` broadcasts)."""
    best = None
    for nv in (1, 2, 3, 4):
        if nvec % nv or nv > budget:
            continue
        rt = best_divisor(er, max(1, budget // nv)) if er else 1
        score = (rt * nv / (rt + nv), rt * nv)
        if best is None or score > best[0]:
            best = (score, nv, rt)
    return best[1], best[2]


class GemmInt8Rule(ScheduleRule):
    """The int8 micro-kernel for one :class:`~forgekit.schedules.int8.DotKernel`; matches only on targets
    that have its instruction (the legalization packed the weights for it)."""

    def __init__(self, kernel: int8.DotKernel) -> None:
        self.kernel = kernel
        self.name = kernel.rule

    def matches(self, sch: Schedule, tinfo: IsaInfo) -> SBlockRV | None:
        if tinfo.dot != self.kernel.key:
            return None
        for b in blocks_of(sch):
            if sch.get(b).name_hint in BLOCKS:
                kinds = iter_kinds(sch, b)
                ns = kinds.count("S")
                if kinds == "S" * ns + "R" * (len(kinds) - ns) and ns >= 2:
                    return b
        return None

    def apply(self, sch: Schedule, main: SBlockRV, tinfo: IsaInfo, knobs: dict[str, Any] | None = None) -> Schedule:
        lanes = self.kernel.lanes
        intrin = self.kernel.register()
        blocks = blocks_of(sch)
        idx = [i for i, b in enumerate(blocks) if sch.get(b).same_as(sch.get(main))][0]
        producers, consumers = blocks[:idx], blocks[idx + 1:]
        if any(is_reduction(sch, b) for b in producers + consumers):
            raise ValueError("unsupported: extra reductions around the int8 block")
        loops = sch.get_loops(main)
        ns = iter_kinds(sch, main).count("S")
        sl, rl = loops[:ns], loops[ns:]
        ev, er = ext(sch, sl[-1]), ext(sch, sl[-2])
        if ev is None or ev % lanes or ext(sch, rl[-1]) != int8.RED:
            raise ValueError(f"vector axis not a multiple of {lanes} or no 4-byte reduction")
        nv, rt = choose_int8_tile(ev // lanes, er, stack_budget(tinfo, lanes=lanes))
        macs = 1
        for l in loops:
            macs *= ext(sch, l) or SYMBOLIC_GUESS
        v_o, v_n, v_l = sch.split(sl[-1], [None, nv, lanes])
        r_o, r_i = sch.split(sl[-2], [None, rt])
        others = list(sl[:-2])
        outer_list = [v_o] + others + [r_o]
        sch.reorder(*outer_list, *rl[:-1], r_i, v_n, v_l, rl[-1])
        outer = sch.fuse(*outer_list)
        if macs >= MIN_PARALLEL_MACS and (ext(sch, outer) is None or ext(sch, outer) > 1):
            sch.parallel(outer)
        attach_epilogue(sch, main, consumers, outer, acc_scope(rt * nv * lanes * 4), tinfo.vec_lanes)
        init = sch.decompose_reduction(main, rl[0])
        sch.tensorize(v_l, intrin)
        sch.unroll(r_i)
        sch.unroll(v_n)
        vectorize_inner(sch, init, tinfo.vec_lanes)
        for p in producers:
            parallel_spatial(sch, p, tinfo.vec_lanes)
        return sch
