"""Register-tiled multiply-accumulate micro-kernel shared by the conv2d and matmul rules.

A "gemm-like" block is a reduction block ``C[..., r, v] += A[...] * B[...]`` whose output's
innermost index ``v`` is a spatial iterator (output channels for NHWC conv, N for matmul) and whose
second-innermost index ``r`` is another spatial iterator (output width for NHWC conv, M for
matmul).  The schedule is the classic CPU GEMM micro-kernel:

    parallel for (v_o, <other spatial>, r_o):          # fused, one task per output tile
        acc[rt][vt] = 0                                 # 'local' scope -> registers
        for <reduction loops>:                          # conv: kh, kw, ic   matmul: k
            for r_i in unroll(rt):
                for v_n in unroll(vt / lanes):
                    acc[r_i][v_n*lanes:(v_n+1)*lanes] += bcast(A) * vload(B)   # one FMA
        epilogue (bias / relu / residual add / ...), vectorized, written straight to the output

with ``rt * vt / lanes`` accumulators sized to the register file of the target (AVX-512: 32 zmm,
AVX2: 16 ymm, NEON: 32 q).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import tvm
from tvm import tirx
from tvm.ir import TensorLoad as _BufferLoad
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV

from ..stack_tiles import constant_bytes
from ..tiling import STREAMING_BYTES, choose_tiles, symbolic_factor, symbolic_vector_tile
from .common import (
    multiple_of,
    SYMBOLIC_GUESS,
    acc_scope,
    attach_epilogue,
    blocks_of,
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


#: Loop orders of the parallel outer loop nest (a tuning knob):
#: "vout": output-channel tile outermost (the weight panel stays hot while sweeping the image);
#: "spatial_outer": image tile outermost (input rows stay hot while sweeping the channels).
ORDERS = ("vout", "spatial_outer")
DEFAULT_ORDER = "vout"


# ~0.25 M multiply-adds is ~2 us on one core: not worth a fork/join
MIN_PARALLEL_MACS = 1 << 18


@dataclass
class GemmLike:
    block: object
    index: int          # position of the block among the root's children
    vpos: int           # spatial iter index of the vector axis
    rpos: Optional[int]  # spatial iter index of the register-tile axis
    n_spatial: int
    streaming: bool = False  # the vector operand streams from beyond the L2 (:func:`streams_weights`)


def _is_mac(store: Any) -> bool:
    """C = C + A * B (either operand order, optional casts)."""
    if not isinstance(store, tirx.BufferStore):
        return False
    v = store.value
    if not isinstance(v, tirx.Add):
        return False
    for acc, prod in ((v.a, v.b), (v.b, v.a)):
        if isinstance(acc, _BufferLoad) and acc.source.same_as(store.buffer):
            while isinstance(prod, tirx.Cast):
                prod = prod.value
            if isinstance(prod, tirx.Mul):
                return True
    return False


def analyze(sch: Schedule, tinfo: IsaInfo | None = None) -> GemmLike | None:
    """Return GemmLike for the single MAC reduction block of the function, or None."""
    blocks = blocks_of(sch)
    red = [(i, b) for i, b in enumerate(blocks) if is_reduction(sch, b)]
    if len(red) != 1:
        return None
    idx, blk = red[0]
    kinds = iter_kinds(sch, blk)
    ns = kinds.count("S")
    if kinds != "S" * ns + "R" * (len(kinds) - ns) or ns < 1:
        return None
    if not loops_match_iters(sch, blk):
        return None
    b = sch.get(blk)
    if not _is_mac(b.body):
        return None
    ivars = [iv.var for iv in b.iter_vars]
    idxs = list(b.body.indices)

    def _pos(e: Any) -> int | None:
        if isinstance(e, tirx.Var):
            for k, v in enumerate(ivars[:ns]):
                if v.same_as(e):
                    return k
        return None

    vpos = _pos(idxs[-1])
    if vpos is None:
        return None
    rpos = _pos(idxs[-2]) if len(idxs) >= 2 else None
    if rpos == vpos:
        rpos = None
    loops = sch.get_loops(blk)
    if rpos is None or ext(sch, loops[rpos]) == 1:
        rpos = _batch_as_rows(b, ivars[:ns], vpos, [ext(sch, lp) for lp in loops[:ns]], rpos)
    # Batch-like axes, the register axis (an image width, a sequence length) and the reduction may be
    # symbolic; a symbolic vector axis only when its extent is a multiple of the vector tile (a column
    # count rounded up by dynamic_matmul): a predicate on vector lanes does not vectorize.
    vext = sch.get(loops[vpos]).extent
    if not isinstance(vext, tirx.IntImm) and (tinfo is None or not multiple_of(vext, symbolic_vector_tile(tinfo))):
        return None
    # everything before the reduction must be spatial producers, everything after consumers
    return GemmLike(blk, idx, vpos, rpos, ns)


def _loads(expr: Any) -> list[Any]:
    while isinstance(expr, tirx.Cast):
        expr = expr.value
    if isinstance(expr, _BufferLoad):
        return [expr]
    if isinstance(expr, tirx.Mul):
        return _loads(expr.a) + _loads(expr.b)
    return []


def _batch_as_rows(block: Any, ivars: list[Any], vpos: int, extents: list[int | None], rpos: int | None) -> int | None:
    """A register-tile axis for a MAC whose row axis is 1 long: the innermost other spatial axis the vector
    operand does not depend on, so each loaded vector of it is reused across the tile's rows.  A GRU's
    input projection ``[T, 1, 257] x [257, 384]`` (time-major, batch 1) tiled one row at a time loaded four
    weight vectors per multiply-add: 1.08 ms at T=300, 3x numpy's sgemm."""
    value = block.body.value
    prod = value.b if isinstance(value.a, _BufferLoad) and value.a.source.same_as(block.body.buffer) else value.a
    def vars_of(load: Any) -> list[Any]:  # packed weights index w[n // 64, k, n % 64]: look inside
        return [v for i in load.indices for v in tirx.analysis.undefined_vars(i)]

    vector_operand = [ld for ld in _loads(prod) if any(v.same_as(ivars[vpos]) for v in vars_of(ld))]
    if len(vector_operand) != 1:
        return rpos
    used = {k for k, iv in enumerate(ivars) for v in vars_of(vector_operand[0]) if v.same_as(iv)}
    for k in reversed(range(len(ivars))):
        if k != vpos and k not in used and extents[k] != 1:
            return k
    return rpos


def _is_identity_copy(sch: Schedule, blk: SBlockRV) -> bool:
    """dst[i...] = src[i...] with the same indices (a pad with zero padding)."""
    b = sch.get(blk)
    st = b.body
    if not isinstance(st, tirx.BufferStore) or not isinstance(st.value, _BufferLoad):
        return False
    ld = st.value
    if len(ld.indices) != len(st.indices):
        return False
    return all(a.same_as(c) for a, c in zip(ld.indices, st.indices))


def _pads_inner_axis(sch: Schedule, blk: SBlockRV) -> bool:
    """A pad whose in-bounds test (``if_then_else`` or ``Select``) is on the innermost axis it writes: the
    matmul's vector axis when it pads the columns of the right operand (a dynamic sequence length rounded up
    to whole vectors).  Inlined, the test and the clamped read it guards run per lane: a gather."""
    import tvm_ffi

    st = sch.get(blk).body
    if not isinstance(st, tirx.BufferStore) or not st.indices:
        return False
    inner = set(tirx.analysis.undefined_vars(st.indices[-1]))
    tests: list[Any] = []

    def note(node: Any) -> Any:
        if isinstance(node, tirx.Select):
            tests.append(node.condition)
        elif getattr(node.op, "name", "") in ("prim.if_then_else", "tirx.if_then_else"):
            tests.append(node.args[0])
        return node

    tvm_ffi.structural_map(st.value, [(tvm.ir.Call, note), (tirx.Select, note)], order="post")
    return any(v in inner for test in tests for v in tirx.analysis.undefined_vars(test))


def streams_weights(sch: Schedule, g: GemmLike) -> bool:
    """Whether ``g``'s vector operand (a matmul's weights) is at least :data:`~..tiling.STREAMING_BYTES`: each
    pass over it then waits on L3 or DRAM (:func:`~..tiling.choose_tiles`).  The packed matmul legalization
    decides the same from the same bytes, so both round a symbolic row axis up to the same tile."""
    b = sch.get(g.block)
    value = b.body.value
    prod = value.b if isinstance(value.a, _BufferLoad) and value.a.source.same_as(b.body.buffer) else value.a
    vvar = b.iter_vars[g.vpos].var
    for ld in _loads(prod):
        if any(v.same_as(vvar) for i in ld.indices for v in tirx.analysis.undefined_vars(i)):
            nbytes = constant_bytes(ld.source)
            return nbytes is not None and nbytes >= STREAMING_BYTES
    return False


def _extents(sch: Schedule, g: GemmLike) -> tuple[int | None, int | None, int]:
    """Extents of the vector and register axes (None: symbolic), and the power of two the register axis is
    known to be a multiple of when symbolic (:func:`~..tiling.symbolic_factor`)."""
    sl = sch.get_loops(g.block)[: g.n_spatial]
    ev = ext(sch, sl[g.vpos])
    er = ext(sch, sl[g.rpos]) if g.rpos is not None else 1
    return ev, er, symbolic_factor(sch.get(sl[g.rpos]).extent) if er is None else 1


def _tiles(ev: int | None, er: int | None, tinfo: IsaInfo, factor: int = 1,
           streaming: bool = False) -> tuple[int, int]:
    """(vector tile, register tile); a symbolic vector axis has dynamic_matmul's tile."""
    if ev is None:
        vt = symbolic_vector_tile(tinfo)
        return vt, choose_tiles(vt, er, tinfo, factor)[1]
    return choose_tiles(ev, er, tinfo, factor, streaming)


def tile_space(sch: Schedule, g: GemmLike, tinfo: IsaInfo) -> list[dict[str, Any]]:
    """Every knob setting the micro-kernel supports for this block, the untuned default first.

    Knobs: ``vt`` (vector tile: 1, 2 or 4 vectors dividing the vector axis), ``rt`` (register tile: a
    divisor of the register axis that keeps ``rt * vt / lanes`` accumulators within the register
    budget; small values included, as they trade register reuse for parallelism) and ``order``.
    This is the search space of :mod:`forgekit.tuning`.
    """
    from .common import divisors

    ev, er, factor = _extents(sch, g)
    lanes, budget = tinfo.vec_lanes, tinfo.acc_budget
    vt0, rt0 = _tiles(ev, er, tinfo, factor, g.streaming)
    if ev is None:  # a column count rounded up to the vector tile: that tile only
        return [{"vt": vt0, "rt": rt, "order": order} for rt in divisors(rt0) for order in ORDERS]
    space = [{"vt": vt0, "rt": rt0, "order": DEFAULT_ORDER}]
    vts = [lanes * nv for nv in (1, 2, 4) if ev % (lanes * nv) == 0] or [vt0]
    for vt in vts:
        nv = max(1, vt // lanes)
        # a symbolic axis is padded to a multiple of the default tile: only its divisors keep full tiles
        rts = [d for d in divisors(er or rt0) if d * nv <= budget]
        rts = sorted(set(rts))[-4:]  # the largest few: tiny tiles are never competitive
        for rt in rts:
            for order in ORDERS:
                knobs = {"vt": vt, "rt": rt, "order": order}
                if knobs not in space:
                    space.append(knobs)
    return space


def schedule_gemm_like(sch: Schedule, g: GemmLike, tinfo: IsaInfo, knobs: dict[str, Any] | None = None) -> Schedule:
    """Schedule the MAC block ``g`` as the micro-kernel; ``knobs`` (from :func:`tile_space`) override
    the default tile sizes and loop order."""
    lanes = tinfo.vec_lanes
    blocks = blocks_of(sch)
    producers = blocks[: g.index]
    consumers = blocks[g.index + 1:]
    if any(is_reduction(sch, b) for b in producers + consumers):
        raise ValueError("unsupported: extra reductions around the MAC block")
    main = g.block
    loops = sch.get_loops(main)
    sl, rl = loops[: g.n_spatial], loops[g.n_spatial:]
    ev, er, factor = _extents(sch, g)
    vt, rt = _tiles(ev, er, tinfo, factor, g.streaming)
    order = DEFAULT_ORDER
    if knobs:
        vt, rt, order = knobs["vt"], knobs["rt"], knobs.get("order", DEFAULT_ORDER)
    macs = 1
    for l in sl + rl:
        macs *= ext(sch, l) or SYMBOLIC_GUESS

    v_o, v_i = sch.split(sl[g.vpos], [None, vt])
    if g.rpos is not None:
        r_o, r_i = sch.split(sl[g.rpos], [None, rt])
    else:
        r_o = r_i = None
    others = [l for k, l in enumerate(sl) if k not in (g.vpos, g.rpos)]
    # A symbolic register axis (a dynamic width or sequence length) stays a serial loop inside the
    # parallel one: fused into it, every tile would split its index by a symbolic extent (integer
    # divisions per tile: PP-OCRv4 rec's 120x6625 classifier ran 3.5x slower than its static twin).
    serial_r = r_o is not None and ext(sch, r_o) is None
    # So does a symbolic axis among the others (a dynamic height) once a static axis would be fused inside
    # it: a 7-tap valid conv over ``frames`` rows, fused as (frames - 6) * 16 * 4, got a write-back
    # region of ``2 * frames - 11`` rows per tile from TVM (a heap overflow).  A symbolic outermost axis
    # (a dynamic batch) fuses safely.
    lead = 0 if order == "spatial_outer" else 1
    serial_o = [l for k, l in enumerate(others) if ext(sch, l) is None and (k or lead)]
    others = [l for l in others if all(not l.same_as(x) for x in serial_o)]
    tiles = [r_o] if r_o is not None and not serial_r else []
    if order == "spatial_outer":
        outer_list = others + tiles + [v_o]
    else:
        outer_list = [v_o] + others + tiles
    inner_list = ([r_i] if r_i is not None else []) + [v_i]
    serial = serial_o + ([r_o] if serial_r else [])
    heights = [l for l in serial_o if not l.same_as(sl[0])]  # symbolic axes other than the batch
    if heights:
        # a dynamic height is the parallel loop itself, unfused (no index split by a symbolic extent, no
        # region trouble), the static tiles serial inside: parallel over the output-channel blocks alone, a
        # dynamic-size PP-OCR det's 24- and 96-channel convs ran on one thread (1.5-1.9x their static twins)
        par, tail = heights[-1], [l for l in serial if not l.same_as(heights[-1])]
        pre = [l for l in tail if any(l.same_as(x) for x in serial_o)]
        tail = [l for l in tail if not any(l.same_as(x) for x in pre)]
        sch.reorder(*pre, par, *outer_list, *tail, *rl, *inner_list)
        fused = sch.fuse(*outer_list) if len(outer_list) > 1 else outer_list[0]
        outer, serial = par, [fused, *tail]
    else:
        sch.reorder(*outer_list, *serial, *rl, *inner_list)
        outer = sch.fuse(*outer_list) if len(outer_list) > 1 else outer_list[0]
    if macs >= MIN_PARALLEL_MACS and (ext(sch, outer) is None or ext(sch, outer) > 1):
        sch.parallel(outer)

    # epilogue: inline the elementwise chain and compute it per tile
    acc_bytes = vt * rt * tvm.DataType(str(sch.get(main).writes[0].source.dtype)).bits // 8
    attach_epilogue(sch, main, consumers, serial[-1] if serial else outer, acc_scope(acc_bytes), lanes)

    # micro-kernel: unroll the register tile, vectorize the lanes
    if vt > lanes and vt % lanes == 0:
        v_n, v_l = sch.split(v_i, [None, lanes])
        sch.vectorize(v_l)
        if r_i is not None:
            sch.unroll(r_i)
        sch.unroll(v_n)
    else:
        sch.vectorize(v_i)
        if r_i is not None:
            sch.unroll(r_i)
    red_total = 1
    for l in rl:
        red_total *= ext(sch, l) or SYMBOLIC_GUESS
    init = sch.decompose_reduction(main, rl[0])
    if red_total <= 25:
        # depthwise: unroll the (kh, kw) window too, so loads shared by neighbouring outputs
        # (x + kw) are CSE'd and the padding checks fold to per-iteration constants
        for l in rl:
            sch.unroll(l)
    vectorize_inner(sch, init, lanes)

    red_extent = 1
    for l in rl:
        red_extent *= ext(sch, l) or SYMBOLIC_GUESS
    for p in producers:  # padding / transposes feeding the kernel: own parallel loop nest
        if _is_identity_copy(sch, p) and try_inline(sch, p):
            continue  # e.g. the zero-size "pad" of a 1x1 conv: read the input directly
        if red_extent <= 25 and not _pads_inner_axis(sch, p) and try_inline(sch, p):
            continue  # depthwise: a separate padded copy costs more than the bounds checks
        parallel_spatial(sch, p, lanes)
    return sch
