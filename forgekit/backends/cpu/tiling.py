"""Tile sizes, chosen the same way by the weight-packing legalizations and by the schedule rules (the
weights are packed for the tile the rule will pick), and the stack budget of a micro-kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import tvm
from tvm import tirx

if TYPE_CHECKING:
    from ...targets.isa import IsaInfo

def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def best_divisor(n: int, limit: int) -> int:
    return max(d for d in divisors(n) if d <= limit) if n >= 1 else 1


def acc_scope(nbytes: int) -> str:
    """Storage scope for a per-tile accumulator of ``nbytes``: on the stack (registers after LLVM's
    SROA) when it fits, under :data:`.stack_tiles.STACK_TILE_BYTES` in CPU builds, else "local" (a workspace
    allocation per tile)."""
    from .stack_tiles import STACK_TILE_BYTES

    return "global" if nbytes < STACK_TILE_BYTES else "local"


def stack_budget(tinfo: IsaInfo, lanes: int | None = None, elem_bytes: int = 4) -> int:
    """Vector accumulators of ``lanes`` (default: the target's fp32 lanes) elements a tile may hold:
    the register budget, capped to fit on the stack as CPU builds keep it (:data:`.stack_tiles.STACK_TILE_BYTES`).

    TVM 0.27 itself puts an allocation on the stack only if it is "global" scope and under 1024 bytes
    (runtime::kMaxStackAlloca); anything else is a TVMBackendAllocWorkspace/FreeWorkspace pair each time the
    enclosing loop body runs, for a register tile inside the parallel loop two calls per tile (measured 2.5x on
    a 1x1 int8 conv).  Capped at that 1 KB instead, an AVX-512 tile held 15 of its 24 accumulators:
    PP-OCRv6 rec's 1x1 convs over 80-pixel rows got 5 rows x 2 vectors, not 5 x 4.  Measured on a Xeon
    (AVX-512, 2 threads, A/B interleaved in one process, outputs bit-identical), with :func:`_reuse`'s padding
    of tall tiles: a 6x80 384->192 1x1 conv 192 -> 252 GFLOP/s; NudeNet 320n 11.8 -> 10.2 ms, PP-OCRv4 det
    43.0 -> 38.6, rec 10.8 -> 9.9, ResNet-18 13.0 -> 12.1, MobileNetV2 4.41 -> 4.11, ResNet-50 42.4 -> 42.0,
    uint8 NudeNet 5.7 -> 4.5; the portable build's v4 level likewise (NudeNet 10.2 -> 9.1, SqueezeNet 4.33 ->
    3.35, MobileNetV2 4.56 -> 4.84), its v3 level, which packs weights as v4 does, 0.92-1.00x.  AVX2's 8
    accumulators (256 bytes) were never capped."""
    from .stack_tiles import STACK_TILE_BYTES

    return max(1, min(tinfo.acc_budget, (STACK_TILE_BYTES - 1) // ((lanes or tinfo.vec_lanes) * elem_bytes)))


def _symbolic_tile(limit: int, factor: int = 1) -> int:
    """Register tile of a symbolic axis, which is rounded up to it (:func:`round_up`): a power of two, so
    the usual sizes (16, 128, 80 = 320 / 4) waste no rows.  Measured on a BERT-style encoder at S=16: a
    7-row tile computed 21 rows and ran 1.4x its static twin.  An axis known to be a multiple of ``factor``
    (:func:`symbolic_factor`) gets at most that: no rounding (see there)."""
    tile = 1
    while tile * 2 <= min(8, limit):
        tile *= 2
    return min(tile, factor) if factor > 1 else tile


def symbolic_factor(extent: Any) -> int:
    """The largest power of two up to 8 that a symbolic ``extent`` is provably a multiple of (1: none).

    ``--dynamic W=32..640:32`` imports W as ``32 * W_div32``, so a stride-16 feature map is ``2 * W_div32``
    wide.  Rounded up to a 4-row tile, ``(2 * W_div32 + 3) // 4 * 4``, TVM's region analysis of the kernel
    failed ("not a stage pipeline") and every rule left the convolution to the fallback schedule: NudeNet's
    stride-2 convs ran at 0.1 GFLOP/s, the model 10x slower than onnxruntime (its static twin: 0.92x).  A
    2-row tile divides such a width exactly."""
    if extent is None or isinstance(extent, int):
        return 1
    analyzer = tvm.sym.Analyzer()
    for f in (8, 4, 2):
        if analyzer.can_prove(tirx.floormod(extent, f) == 0):
            return f
    return 1


#: Weights of at least this many bytes are read from beyond a core's L2 (1 MB on Zen 4, 2 MB on Sapphire
#: Rapids) on every call: a kernel streaming them should read each panel in as few passes as it can.
STREAMING_BYTES = 1 << 20


def choose_tiles(ev: int, er: int | None, tinfo: IsaInfo, factor: int = 1,
                 streaming: bool = False) -> tuple[int, int]:
    """(vector tile, register tile) for a vector axis of ``ev`` and a register axis of ``er`` elements (None: a
    symbolic extent, which the legalization rounds up to the register tile): :func:`_choose_tiles`.

    ``streaming``: the kernel reads weights of :data:`STREAMING_BYTES` or more, once per row tile.  The vector
    tile (the packed weights' layout) stays; the register tile takes as many rows as the whole accumulator
    budget holds, on the stack past 1 KB (:mod:`.stack_tiles`), so each weight panel is read in fewer passes.
    Measured on this Xeon (2 threads, alternating, min of 9 medians): [8, 1024] x [1024, 8210], 4 rows x 2
    vectors (2 passes) 5.1 ms, 8 x 2 (1 pass) 2.3 ms, onnxruntime 2.4; [16, 1024] x [1024, 8210]: 3.8 -> 3.3 ms
    (16 x 2 would need 32 registers: 3.0-3.5, spilling)."""
    vt, rt = _choose_tiles(ev, er, tinfo, factor)
    if not streaming:
        return vt, rt
    from .stack_tiles import STACK_TILE_BYTES

    nv = max(1, vt // tinfo.vec_lanes)
    limit = max(1, min(tinfo.acc_budget, (STACK_TILE_BYTES - 1) // (tinfo.vec_lanes * 4)) // nv)
    return vt, max(rt, _symbolic_tile(limit, factor) if er is None else best_divisor(er, limit))


def _choose_tiles(ev: int, er: int | None, tinfo: IsaInfo, factor: int = 1) -> tuple[int, int]:
    """(vector tile, register tile) for a vector axis of ``ev`` and a register axis of ``er`` elements
    (None: a symbolic extent, which the legalization rounds up to the register tile).

    With ``tinfo.shared_layout`` the vector tile is the packed weights' (:func:`layout_tile`, AVX-512's) up
    to 4 of the target's vectors, a 4-vector part of it beyond; the register tile fits the rest of the
    target's registers.  Measured against each level's own layout (one process, alternating, min of 12, 2
    threads on this Zen 4): x86-64-v3 3-4 % slower (ResNet-50 40.5 -> 42.1 ms, MobileNetV2 4.58 -> 4.89),
    x86-64-v2 3-4 % faster (101.1 -> 96.7, 10.38 -> 10.04).  Computing on the whole wide tile cost v3 5-10 %
    (a 64-wide tile is 8 AVX2 registers: one row per weight load), computing on v3's own tile inside the
    wide blocks 9 %."""
    vt = _wide_tile(ev, er, tinfo)
    if vt is not None:
        nv = vt // tinfo.vec_lanes
        if nv > 4:  # a row of more than 4 registers feeds each weight load to too few rows
            vt, nv = 4 * tinfo.vec_lanes, 4
        budget = max(1, stack_budget(tinfo) // nv)
        return vt, (_symbolic_tile(budget, factor) if er is None else best_divisor(er, budget))
    return _own_tiles(ev, er, tinfo, factor)


def choose_dot_tile(nvec: int, er: int | None, budget: int, factor: int = 1) -> tuple[int, int]:
    """(vectors per row ``nv``, rows ``rt``) of the dot-product rules' accumulator tile (:mod:`.rules.dot_tile`):
    ``nv`` divides the ``nvec`` output vectors, ``rt`` the row extent ``er``, ``nv * rt <= budget``; maximizes
    dot instructions per load (``nv * rt`` dot products per ``nv`` weight loads + ``rt`` broadcasts).  A
    symbolic ``er`` (None) that is a multiple of ``factor`` (:func:`symbolic_factor`; the legalization rounds a
    dynamic width up to the tile it asks for here) gets a power-of-two tile dividing ``factor``, else 1 row."""
    best = None
    for nv in (1, 2, 3, 4):
        if nvec % nv or nv > budget:
            continue
        limit = max(1, budget // nv)
        rt = best_divisor(er, limit) if er else (_symbolic_tile(limit, factor) if factor > 1 else 1)
        score = (rt * nv / (rt + nv), rt * nv)
        if best is None or score > best[0]:
            best = (score, nv, rt)
    return best[1], best[2]


def _own_tiles(ev: int, er: int | None, tinfo: IsaInfo, factor: int = 1) -> tuple[int, int]:
    lanes, budget = tinfo.vec_lanes, stack_budget(tinfo)
    best: tuple[int, int, int] | None = None
    for nv in (2, 1, 4):
        vt = lanes * nv
        if ev % vt:
            continue
        rt = _symbolic_tile(max(1, budget // nv), factor) if er is None else best_divisor(er, max(1, budget // nv))
        score = min(rt, 8) * nv  # FMAs per (broadcast + vector loads) ~ reuse
        if best is None or score > best[2]:
            best = (vt, rt, score)
    if best is None:  # vector axis not a multiple of the lanes (e.g. 24 or 1000 channels)
        vt = best_divisor(ev, lanes)
        if vt < lanes // 2 and ev <= lanes * 2:
            vt = ev
        rt = _symbolic_tile(budget, factor) if er is None else best_divisor(er, budget)
        best = (vt, rt, 0)
    return best[0], best[1]


def layout_tile(ev: int, er: int | None, tinfo: IsaInfo) -> int:
    """The vector tile weights are packed for: :func:`choose_tiles`' own, or with ``tinfo.shared_layout`` (the
    x86-64 levels below v4 of a portable artifact) AVX-512's, wherever it is whole vectors of the target's, so
    those levels' packed weights are v4's, byte for byte, and stored once (:mod:`.shared_weights`)."""
    wide = _wide_tile(ev, er, tinfo)
    return wide if wide is not None else _own_tiles(ev, er, tinfo)[0]


def padded_columns(n: int, tinfo: IsaInfo) -> int:
    """The output channels (columns) a packed conv or matmul computes: ``n``, or ``n`` rounded up to whole
    vectors when it is not and spans more than one (1000 classes -> 1008 on AVX-512), the extra ones from zero
    weights, sliced off in the epilogue.

    A ``shared_layout`` target rounds as AVX-512 does when that adds at most 1/16 more columns than its own
    rounding, so that its packed weights are v4's, byte for byte, and stored once: ddddocr's 8210-class head
    (33.6 MB) was padded to 8224, 8216 and 8212 columns by v4, v3 and v2, three layouts, and so stored three
    times (127 MB artifact for 54 MB of ONNX).  Narrow layers (24 channels: 32 against 24) keep their own:
    a third more compute for a few KB of weights."""
    own = _whole_vectors(n, tinfo.vec_lanes)
    if tinfo.shared_layout:
        from ...targets.isa import LAYOUT_LANES

        wide = _whole_vectors(n, LAYOUT_LANES)
        if wide * 16 <= own * 17:
            return wide
    return own


def _whole_vectors(n: int, lanes: int) -> int:
    return -(-n // lanes) * lanes if n % lanes and n > lanes else n


def padded_rows(ev: int, er: int, tinfo: IsaInfo) -> int:
    """The rows a kernel with a static register axis of ``er`` computes: ``er``, or a few more when ``er`` has
    no divisor that makes a good register tile (a prime: ViT's 197 or 101 tokens, the class token on 14x14 or
    10x10 patches, left 1-row tiles, each weight load feeding one row).  The extra rows read a clamped
    (valid, repeated) input row and are sliced off, as a symbolic axis's are (:func:`round_up`); at most
    an eighth more rows, and only where the tile's reuse at least doubles.  A ``shared_layout`` target pads
    as AVX-512 would, so every level of a portable artifact packs the same weights, and to an even count, so
    the AVX2 and SSE levels, whose register budget allows 2-row tiles there, get them too (101 -> 112 rather
    than 105, 197 -> 210)."""
    isa = _layout_isa(tinfo) if tinfo.shared_layout else tinfo
    current = _reuse(ev, er, isa)
    if current > 4:  # e.g. 128 rows: 4-row tiles of 2 vectors
        return er
    best, best_reuse, best_tile = er, current, current
    for rows in range(er + 2 - er % 2, er + max(2, er // 8) + 1, 2):
        tile = _reuse(ev, rows, isa)
        if (reuse := tile * er / rows) > best_reuse:
            best, best_reuse, best_tile = rows, reuse, tile
    # the tile's own reuse must double; the rows it adds already weigh in the choice among candidates.  Asking
    # the weighted reuse to double (as before) never padded on AVX2, whose 8 accumulators give at most 2x the
    # 1-row tile's: 197 -> 198 rows weighs 8 * 197/198 < 8, so ViT's prime token counts kept 1-row tiles there
    return best if best_tile >= 2 * current else er


def _reuse(ev: int, er: int, tinfo: IsaInfo) -> int:
    """:func:`_own_tiles`' reuse score of its tile for these extents."""
    vt, rt = _own_tiles(ev, er, tinfo)
    nv = max(1, vt // tinfo.vec_lanes)
    # a one-vector tile pays a broadcast per multiply-add, so its rows count half: with AVX-512's 24
    # accumulators a prime row count up to 23 (19 pixels, 13 tokens) got a 19 x 1 tile, which reads like
    # 8 x 1 and so was never padded.  Measured on a Xeon (AVX-512, 2 threads): a 1x1 conv 256->64 on 19x19
    # 82.8-84.5 us as 19 x 1, 41.9-43.9 padded to 20 (5 x 4); on 13x13 42-48 as 13 x 1, 34-37 padded to 14
    # (7 x 2); two runs
    return min(rt, 8) * nv if nv > 1 else max(1, min(rt, 8) // 2)


def _layout_isa(tinfo: IsaInfo) -> IsaInfo:
    from dataclasses import replace

    from ...targets.isa import LAYOUT_LANES, LAYOUT_REGS

    return replace(tinfo, vec_lanes=LAYOUT_LANES, num_regs=LAYOUT_REGS, shared_layout=False)


def _wide_tile(ev: int, er: int | None, tinfo: IsaInfo) -> int | None:
    """AVX-512's vector tile for a ``shared_layout`` target, when it is whole vectors of the target's (not for
    an axis of fewer lanes, e.g. a 4-channel output conv); None otherwise."""
    if not tinfo.shared_layout:
        return None
    wide = _own_tiles(ev, er, _layout_isa(tinfo))[0]
    return wide if wide % tinfo.vec_lanes == 0 and ev % wide == 0 else None


def symbolic_vector_tile(tinfo: IsaInfo) -> int:
    """Vector tile of a symbolic column axis: dynamic_matmul rounds the columns up to it, and the matmul rule
    tiles them by it."""
    return tinfo.vec_lanes


def round_up(extent: Any, tile: int) -> Any:
    """A symbolic ``extent`` rounded up to a multiple of ``tile``.

    A kernel whose tiled axis is symbolic (an image width, a sequence length) computes this many rows or
    columns, the extra ones from a clamped (valid, repeated) input row or a zero-padded column, and its
    epilogue slices them off: every tile is full, so the micro-kernel runs without a bounds predicate on
    each multiply-add.  Tiles of a bare split of the symbolic axis carry that predicate: 2.9x slower
    (PP-OCRv4 rec, W=320).
    """
    return tirx.floordiv(extent + (tile - 1), tile) * tile
