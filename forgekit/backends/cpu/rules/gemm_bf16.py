"""bf16 conv2d/matmul rule: the int8 micro-kernel (:mod:`.gemm_int8`) with ``vdpbf16ps`` (see :mod:`..bf16`).

Matches the blocks made by :mod:`..bf16` (``conv2d_nhwc_bf16`` / ``matmul_bf16``): spatial ``[..., r, v]``
and reduction ``[..., c, i]`` with ``i`` the bf16 pair of one lane.  Schedule::

    parallel for (v_o, <other spatial>, r_o):           # carries pragma_import_llvm: forgekit_dpbf16ps
        acc[rt][16 nv] = 0                              # fp32, on the stack -> zmm registers
        for <reductions except i>:
            for r_i in unroll(rt): for v_n in unroll(nv):
                acc[r_i][v_n] = vdpbf16ps(acc[r_i][v_n], bcast(x[2 bf16]), w[32 bf16])
        fp32 epilogue (channel slice, bias, relu, ...)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV

from .. import bf16
from .base import ScheduleRule
from .common import (
    MIN_PARALLEL_ELEMS,
    SYMBOLIC_GUESS,
    acc_scope,
    attach_epilogue,
    blocks_of,
    ext,
    is_reduction,
    iter_kinds,
    parallel_spatial,
    stack_budget,
    vectorize_inner,
)
from .gemm_int8 import choose_int8_tile
from .tiled import MIN_PARALLEL_MACS

if TYPE_CHECKING:
    from ....targets.isa import IsaInfo

BLOCKS = ("conv2d_nhwc_bf16", "matmul_bf16")


def _parallel_ok(sch: Schedule, spatial: list, reduction: list) -> bool:
    """Whether the tile loop may be parallel.  With a symbolic (batch) axis, only when one sample's tile nest
    is never small: :mod:`..serial_when_small` twins a small-able parallel nest with a serial copy that shares
    the tensorized blocks' match buffers, which TVM's lowering rejects ("buffer match constraint ... unmet").
    The instruction count per sample bounds the work that pass counts from below."""
    if all(ext(sch, l) is not None for l in spatial):
        return True
    calls = 1
    for l in [*spatial[:-1], *reduction[:-1]]:
        calls *= ext(sch, l) or 1
    return calls * (ext(sch, spatial[-1]) // bf16.LANES) >= MIN_PARALLEL_ELEMS


class GemmBf16Rule(ScheduleRule):
    """The bf16 micro-kernel; matches only on targets with AVX512_BF16 (the legalization packed the weights
    for it, and only there)."""

    name = "gemm_bf16"

    def matches(self, sch: Schedule, tinfo: IsaInfo) -> SBlockRV | None:
        if not bf16.has_bf16(tinfo):
            return None
        for b in blocks_of(sch):
            if sch.get(b).name_hint in BLOCKS:
                kinds = iter_kinds(sch, b)
                ns = kinds.count("S")
                if kinds == "S" * ns + "R" * (len(kinds) - ns) and ns >= 2:
                    return b
        return None

    def apply(self, sch: Schedule, main: SBlockRV, tinfo: IsaInfo, knobs: dict[str, Any] | None = None) -> Schedule:
        lanes = bf16.LANES
        intrin = bf16.register_intrin()
        blocks = blocks_of(sch)
        idx = [i for i, b in enumerate(blocks) if sch.get(b).same_as(sch.get(main))][0]
        producers, consumers = blocks[:idx], blocks[idx + 1:]
        if any(is_reduction(sch, b) for b in producers + consumers):
            raise ValueError("unsupported: extra reductions around the bf16 block")
        loops = sch.get_loops(main)
        ns = iter_kinds(sch, main).count("S")
        sl, rl = loops[:ns], loops[ns:]
        ev, er = ext(sch, sl[-1]), ext(sch, sl[-2])
        if ev is None or ev % lanes or ext(sch, rl[-1]) != bf16.RED:
            raise ValueError(f"vector axis not a multiple of {lanes} or no bf16 pair reduction")
        nv, rt = choose_int8_tile(ev // lanes, er, stack_budget(tinfo, lanes=lanes))
        macs = 1
        for l in loops:
            macs *= ext(sch, l) or SYMBOLIC_GUESS
        parallel_ok = _parallel_ok(sch, sl, rl)
        v_o, v_n, v_l = sch.split(sl[-1], [None, nv, lanes])
        r_o, r_i = sch.split(sl[-2], [None, rt])
        outer_list = [v_o, *sl[:-2], r_o]
        sch.reorder(*outer_list, *rl[:-1], r_i, v_n, v_l, rl[-1])
        outer = sch.fuse(*outer_list)
        if macs >= MIN_PARALLEL_MACS and (ext(sch, outer) is None or ext(sch, outer) > 1) and parallel_ok:
            sch.parallel(outer)
        # the LLVM function the intrinsic calls: parsed, linked and inlined by the LLVM codegen
        sch.annotate(outer, "pragma_import_llvm", bf16.LLVM_IR)
        attach_epilogue(sch, main, consumers, outer, acc_scope(rt * nv * lanes * 4), tinfo.vec_lanes)
        init = sch.decompose_reduction(main, rl[0])
        sch.tensorize(v_l, intrin)
        sch.unroll(r_i)
        sch.unroll(v_n)
        vectorize_inner(sch, init, tinfo.vec_lanes)
        for p in producers:
            parallel_spatial(sch, p, tinfo.vec_lanes)
        return sch
