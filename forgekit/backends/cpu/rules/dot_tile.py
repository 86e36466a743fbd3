"""The register-tiled micro-kernel around a dot-product instruction, shared by the int8 (:mod:`.gemm_int8`:
``vpdpbusd``, ``sdot``) and bf16 (:mod:`.gemm_bf16`: ``vdpbf16ps``) rules.

Both legalizations make blocks with spatial ``[..., r, v]`` and reduction ``[..., c, i]``, ``i`` the
elements one lane's instruction reduces (4 bytes, or a bf16 pair).  Schedule, for ``L`` lanes::

    parallel for (v_o, <other spatial>, r_o):
        acc[rt][vt] = 0                              # local -> vector registers
        for <reductions except i>:
            for r_i in unroll(rt): for v_n in unroll(vt/L):
                acc[r_i][v_n] = dot(acc[r_i][v_n], bcast(x[i]), w[i * L])
        epilogue
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV

from ..tiling import choose_dot_tile, symbolic_factor
from .base import ScheduleRule
from .common import (
    SYMBOLIC_GUESS,
    acc_scope,
    attach_epilogue,
    blocks_of,
    ext,
    is_reduction,
    iter_kinds,
    parallel_spatial,
    position,
    stack_budget,
    vectorize_inner,
)
from .tiled import MIN_PARALLEL_MACS

if TYPE_CHECKING:
    from ....targets.isa import IsaInfo


class DotTileRule(ScheduleRule):
    """Subclasses say which blocks, lanes and reduction width, when the target has the instruction, and
    the tensor intrinsic; optionally whether the tile loop may be parallel and what to annotate on it."""

    name = "dot_tile"
    blocks: tuple[str, ...] = ()
    lanes = 16
    red = 4
    what = "dot product"

    def available(self, tinfo: IsaInfo) -> bool:
        raise NotImplementedError

    def intrinsic(self) -> str:
        raise NotImplementedError

    def may_parallel(self, sch: Schedule, spatial: list, reduction: list) -> bool:
        return True

    def annotate(self, sch: Schedule, outer: Any) -> None:
        """Hook on the fused tile loop (the bf16 rule links its LLVM helper there)."""

    def channels_inner(self, sch: Schedule, spatial: list, reduction: list) -> bool:
        """Whether the fused tile loop runs the output-channel blocks innermost (pixel tiles outer); by default
        a channel block sweeps every pixel, its weights staying in cache while the input streams past."""
        return False

    def matches(self, sch: Schedule, tinfo: IsaInfo) -> SBlockRV | None:
        if not self.available(tinfo):
            return None
        for b in blocks_of(sch):
            if sch.get(b).name_hint in self.blocks:
                kinds = iter_kinds(sch, b)
                ns = kinds.count("S")
                if kinds == "S" * ns + "R" * (len(kinds) - ns) and ns >= 2:
                    return b
        return None

    def apply(self, sch: Schedule, main: SBlockRV, tinfo: IsaInfo, knobs: dict[str, Any] | None = None) -> Schedule:
        lanes = self.lanes
        intrin = self.intrinsic()
        blocks = blocks_of(sch)
        idx = position(sch, blocks, main)
        producers, consumers = blocks[:idx], blocks[idx + 1:]
        if any(is_reduction(sch, b) for b in producers + consumers):
            raise ValueError(f"unsupported: extra reductions around the {self.what} block")
        loops = sch.get_loops(main)
        ns = iter_kinds(sch, main).count("S")
        sl, rl = loops[:ns], loops[ns:]
        ev, er = ext(sch, sl[-1]), ext(sch, sl[-2])
        if ev is None or ev % lanes or ext(sch, rl[-1]) != self.red:
            raise ValueError(f"vector axis not a multiple of {lanes} or no {self.red}-element {self.what} reduction")
        # a symbolic row axis (a dynamic image width) comes rounded up to whole tiles (dot_conv.output_width)
        factor = symbolic_factor(sch.get(sl[-2]).extent) if er is None else 1
        nv, rt = choose_dot_tile(ev // lanes, er, stack_budget(tinfo, lanes=lanes), factor)
        macs = 1
        for l in loops:
            macs *= ext(sch, l) or SYMBOLIC_GUESS
        parallel_ok = self.may_parallel(sch, sl, rl)
        inner = self.channels_inner(sch, sl, rl)
        v_o, v_n, v_l = sch.split(sl[-1], [None, nv, lanes])
        r_o, r_i = sch.split(sl[-2], [None, rt])
        others = list(sl[:-2])
        if all(ext(sch, l) is not None for l in [*others[1:], r_o]):
            # static image (the batch may be symbolic): one parallel loop over every tile
            outer_list = [*others, r_o, v_o] if inner else [v_o, *others, r_o]
            sch.reorder(*outer_list, *rl[:-1], r_i, v_n, v_l, rl[-1])
            outer = last = sch.fuse(*outer_list)
        else:
            # a dynamic image size: fused with the others, a symbolic height or width split every tile's index
            # by symbolic extents (integer divisions per tile, and an epilogue predicate over all of them that
            # kept it from vectorizing: an int8 64->64 3x3 conv at 64x80 ran 4x its static twin), and TVM
            # gave a fused symbolic height wrong write-back regions in the fp32 rule (see rules.tiled).  So
            # the height is the parallel loop, unfused (a width or a matmul's rows alone: the static loops
            # fused), the tiles serial inside it.
            tiles = [r_o, v_o] if inner else [v_o, r_o]
            sym = [l for l in others[1:] if ext(sch, l) is None]  # a symbolic batch stays the outermost loop
            if sym:
                outer, rest = sym[-1], [l for l in others if not l.same_as(sym[-1])]
                sch.reorder(*rest, outer, *tiles, *rl[:-1], r_i, v_n, v_l, rl[-1])
                last = tiles[-1]
            else:
                fixed = [l for l in [*others, *tiles] if ext(sch, l) is not None]
                sch.reorder(*fixed, r_o, *rl[:-1], r_i, v_n, v_l, rl[-1])
                outer = sch.fuse(*fixed) if len(fixed) > 1 else fixed[0]
                last = r_o
        if macs >= MIN_PARALLEL_MACS and (ext(sch, outer) is None or ext(sch, outer) > 1) and parallel_ok:
            sch.parallel(outer)
        self.annotate(sch, outer)
        attach_epilogue(sch, main, consumers, last, acc_scope(rt * nv * lanes * 4), tinfo.vec_lanes)
        init = sch.decompose_reduction(main, rl[0])
        sch.tensorize(v_l, intrin)
        sch.unroll(r_i)
        sch.unroll(v_n)
        vectorize_inner(sch, init, tinfo.vec_lanes)
        for p in producers:
            parallel_spatial(sch, p, tinfo.vec_lanes)
        return sch
