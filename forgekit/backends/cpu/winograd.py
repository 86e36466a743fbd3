"""3x3 stride-1 convolutions (any padding, a dilated height, static or symbolic sizes: :func:`applies`) as
Winograd F(m x m, 3 x 3) (Lavin & Gray 2016): per m x m output tile and channel
pair, (m + 2)^2 multiply-adds instead of 9 m^2 (F(2x2): 16 instead of 36; F(4x4): 36 instead of 144), in three
kernels the rules schedule (alpha = m + 2, E = alpha^2 GEMMs)::

    V[e, t, c] = (B^T d B)[e]           d: the alpha x alpha input patch of tile t   (winograd_input)
    M[e, t, k] = sum_c V[e, t, c] U[e, c, k]    U = G g G^T, packed at compile time (E GEMMs: matmul rule)
    Y[n, y, x, k] = (A^T M A)[y % m, x % m]     (winograd_output; bias/ReLU/SiLU/residual fused after)

Why: forgekit's direct 3x3 convolutions already ran at 90-95 % of this CPU's fp32 peak (ResNet-50's
``conv2d16`` at 222 of 232 GFLOP/s), so the remaining speed was in doing fewer multiply-adds.  Measured
(2 threads, Zen 4, one process, kernels only): 64->64 at 56x56 2.06 ms direct, 1.17 F(2x2), 0.72 F(4x4);
256->256 at 14x14 2.02 / 0.98 / 0.81; 512->512 at 7x7 2.03 / 1.44 / 1.37.  ResNet-50 38.3 -> 31.3 ms.

Which one (:func:`choose`): F(4x4) where both output sides are >= 14 (a symbolic side counts as large) and its
U (4x the weights) stays under 4 MiB, F(2x2) elsewhere, and in bf16.  Rounding: F(2x2) transforms by +-1 and 1/2
only and stays at the direct kernel's error (2.5e-7 vs 6e-7 relative, fp32); F(4x4) scales by up to 8 and loses
about a decimal digit (4e-6), ten times inside onnxruntime comparisons' tolerance.

Not TVM's ``topi.nn.conv2d_winograd_nhwc``: it computes the transforms as dense reductions with the B/A
matrices (multiplies by 0 and 1 included, scheduled as reductions by our rules) and lays M out for GPU
schedules; here each transform is two injective blocks of additions whose cases fold to constants once the
rule unrolls them, and the GEMM is a plain batched matmul on weights packed like :mod:`.packed_conv`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from tvm import te, tirx, topi

from .tiling import choose_tiles, layout_tile, round_up

if TYPE_CHECKING:
    from ...targets.isa import IsaInfo


@dataclass(frozen=True)
class Tile:
    """One Winograd algorithm F(m x m, 3 x 3) (Lavin & Gray 2016): ``m x m`` outputs from an ``(m + 2)``-square
    input patch; ``bt``, ``g``, ``at`` are B^T, G and A^T."""

    m: int
    bt: tuple
    g: tuple
    at: tuple

    @property
    def alpha(self) -> int:
        return self.m + 2


#: interpolation points 0, 1, -1: the transforms add and subtract only
F2 = Tile(2, ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1)),
          ((1, 0, 0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0, 0, 1)),
          ((1, 1, 1, 0), (0, 1, -1, -1)))
#: points 0, 1, -1, 2, -2: 36 multiply-adds per 16 outputs (F2: 16 per 4); the transforms scale by up to 8
F4 = Tile(4, ((4, 0, -5, 0, 1, 0), (0, -4, -4, 1, 1, 0), (0, 4, -4, -1, 1, 0), (0, -2, -1, 2, 1, 0),
              (0, 2, -1, -2, 1, 0), (0, 4, 0, -5, 0, 1)),
          ((1 / 4, 0, 0), (-1 / 6, -1 / 6, -1 / 6), (-1 / 6, 1 / 6, -1 / 6), (1 / 24, 1 / 12, 1 / 6),
           (1 / 24, -1 / 12, 1 / 6), (0, 0, 1)),
          ((1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0), (0, 1, -1, 8, -8, 1)))

#: block annotation of the output transform: its tile size m
TILE_ATTR = "forgekit.winograd_m"
#: the first (per channel vector) blocks of the input and output transforms
ROWS, COLS = "winograd_rows", "winograd_cols"

#: relax OpPatternKind values (AnnotateTIROpPattern keeps a PrimFunc's own non-zero "op_pattern")
_OUT_ELEMWISE_FUSABLE, _OPAQUE = 4, 8

#: below this many input channels the two extra passes over memory cost more than the saved multiply-adds
MIN_CHANNELS = 32
#: ... except where measured lower, by the fp32 vector lanes.  AVX2 (8 lanes; Zen 3, fp32 conv alone, 2 threads,
#: min of 7 x 30 calls, direct -> Winograd): 16 -> 16 channels at 80x80 0.326 -> 0.178 ms, 160x160 1.263 -> 1.111,
#: 40x40 0.080 -> 0.064, 20x20 0.022 -> 0.017; 16 -> 32 at 80x80 0.484 -> 0.350; 16 -> 64 at 55x55 (SqueezeNet's
#: expand) 0.879 -> 0.353; 24 -> 24 at 40x40 0.183 -> 0.093.  The direct kernel ran those at ~100 GFLOP/s, half
#: this CPU's fp32 peak (bench/cpu_peak.py: 204).  AVX-512 and NEON keep 32: not measured there
MIN_CHANNELS_BY_LANES = {8: 16}


def min_channels(lanes: int) -> int:
    """The fewest input channels that take Winograd on a CPU of ``lanes`` fp32 vector lanes."""
    return MIN_CHANNELS_BY_LANES.get(lanes, MIN_CHANNELS)


def applies(attrs: Any, w: np.ndarray, shape: tuple, lanes: int, least: int | None = None) -> bool:
    """Whether the NHWC/HWIO conv2d with ``attrs``, constant weights ``w`` and input ``shape`` takes the Winograd
    path: 3x3, stride 1, any padding, a dilated height (not width), one group, channels in whole vectors, at least
    ``least`` input channels (default :func:`min_channels`)."""
    kh, kw, icg, oc = w.shape
    if (kh, kw) != (3, 3) or int(attrs.groups) != 1:
        return False
    if [int(v) for v in attrs.strides] != [1, 1] or int(attrs.dilation[1]) != 1:
        return False  # a dilated width: a tile's columns d apart made the epilogue's extent non-constant
    n, h, wd, ic = shape
    if isinstance(h, int) and isinstance(wd, int):
        if h < 4 or wd < 4:
            return False
    elif not (isinstance(n, int) and n == 1) and int(attrs.dilation[0]) != 1:
        return False  # a symbolic height or width over several images is stacked (emit), a dilated one not
    return ic == icg and ic >= (min_channels(lanes) if least is None else least) and oc % lanes == 0


def _combo(coef: tuple, get: Any) -> Any:
    """sum_i coef[i] * get(i) for small integer coefficients: adds and subtracts, a multiply where |coef| > 1."""
    expr = None
    # a positive term first, so no case starts with a negation (TIR spells it as a multiply by -1)
    order = sorted((i for i, c in enumerate(coef) if c), key=lambda i: coef[i] < 0)
    for i in order:
        c = coef[i]
        term = get(i)
        if abs(c) != 1:
            term = term * tirx.const(float(abs(c)), "float32")
        if expr is None:
            expr = term if c > 0 else -term
        else:
            expr = expr + term if c > 0 else expr - term
    return expr


def _select(index: Any, cases: list[Any]) -> Any:
    """cases[index] as a chain of Selects: the rule unrolls ``index``, and each chain folds to one case."""
    expr = cases[-1]
    for i in range(len(cases) - 2, -1, -1):
        expr = tirx.Select(index == i, cases[i], expr)
    return expr


def transform_weights(w: np.ndarray, tile: Tile = F2) -> np.ndarray:
    """HWIO [3, 3, C, K] -> U [alpha^2, C, K], U[a * alpha + b] = (G g G^T)[a, b] (float64, rounded once)."""
    g = np.array(tile.g, dtype=np.float64)
    u = np.einsum("ai,ijck,bj->abck", g, w.astype(np.float64), g)
    return u.reshape(tile.alpha ** 2, w.shape[2], w.shape[3]).astype(np.float32)


@dataclass(frozen=True)
class Gemm:
    """How the alpha^2 GEMMs run: ``store`` turns a transformed input value (fp32, or ``load``'s type) into
    V's element, ``pack`` lays out U ``[E, C, K]`` as the constant ``compute(V, packed)`` multiplies into M
    ``[E, T, K]``, ``result`` turns M's element into what the output transform sums (fp32 M: itself).
    Made by a :data:`GemmFactory`: :func:`fp32_gemm` here, the ``vdpbf16ps`` one in :mod:`.bf16`, the int16
    ``vpmaddwd`` one in :mod:`.int8_winograd`."""

    store: Callable[[Any], Any]
    pack: Callable[[np.ndarray], np.ndarray]
    compute: Callable[[Any, Any], Any]
    result: Callable[[Any], Any] = lambda value: value  # noqa: E731 - a field's default


def fp32_gemm(e: int, c: int, k: int, tiles: int, tinfo: IsaInfo) -> Gemm:
    """fp32 multiply-adds on U packed ``[E, K/vt, C, vt]`` (the matmul rule's vector tile ``vt``, as in
    :mod:`.packed_conv`)."""
    vt = layout_tile(k, tiles if isinstance(tiles, int) else None, tinfo)  # symbolic: the rule's own choice

    def pack(u: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(u.reshape(e, c, k // vt, vt).transpose(0, 2, 1, 3))

    def compute(v: Any, up: Any) -> Any:
        rc = te.reduce_axis((0, c), "rc")
        return te.compute((e, tiles, k), lambda ee, t, kk: te.sum(v[ee, t, rc] * up[ee, kk // vt, rc, kk % vt],
                                                                   axis=[rc]), name="winograd_gemm")
    return Gemm(lambda value: value, pack, compute)


def pair_gemm(e: int, c: int, k: int, tiles: int, red: int, lanes: int, elements: Callable[[np.ndarray], np.ndarray],
              operand: Callable[[Any], Any], name: str, store: Callable[[Any], Any] = lambda value: value,
              result: Callable[[Any], Any] = lambda value: value) -> Gemm:
    """The GEMMs on an instruction that sums ``red`` adjacent products into each of ``lanes`` lanes (bf16
    ``vdpbf16ps`` in :mod:`.bf16`, int16 ``vpmaddwd`` in :mod:`.int8_winograd`): U as ``elements(u)`` packed
    ``[E, K/lanes, C/red, lanes, red]`` like the direct convs' weights, each product ``operand(V) *
    operand(U)`` in a block called ``name`` (the one the instruction's dot-tile rule tensorizes)."""
    def pack(u: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(elements(u).reshape(e, c // red, red, k // lanes, lanes).transpose(0, 3, 1, 4, 2))

    def compute(v: Any, up: Any) -> Any:
        r = te.reduce_axis((0, c // red), "rk")
        ri = te.reduce_axis((0, red), "ri")
        return te.compute((e, tiles, k), lambda ee, t, kk: te.sum(
            operand(v[ee, t, r * red + ri]) * operand(up[ee, kk // lanes, r, kk % lanes, ri]), axis=[r, ri]),
            name=name)
    return Gemm(store, pack, compute, result)


#: (GEMMs E, input channels C, output channels K, tiles T) -> the :class:`Gemm` to run
GemmFactory = Callable[[int, int, int, int], Gemm]


def emit(bb: Any, data: Any, w: np.ndarray, shape: tuple, out_shape: tuple, tinfo: IsaInfo,
         tile: Tile = F2, gemm_factory: GemmFactory | None = None, load: Callable[[Any], Any] | None = None,
         dilation: int = 1, pad: tuple[int, int] = (1, 1)) -> Any:
    """Emit the three kernels for ``conv2d(data, w)`` into ``bb``; returns the output call (NHWC).  The GEMMs are
    ``gemm_factory``'s (default: :func:`fp32_gemm`); ``load`` turns an element of ``data`` into fp32 (bf16 bits
    kept between layers, :mod:`.bf16_activations`; padding is a zero of ``data``'s type); ``pad``: the padding
    above and left of the image (below and right follow from ``out_shape``).

    ``dilation`` ``d`` of the height (an audio model's frames): a tile is ``m`` rows ``d`` apart, whose inputs
    are ``d`` apart too, so the same transforms apply; the tile rows go in groups of ``d`` (one per phase) over
    ``d * m`` rows: tile row ``u`` covers rows ``(u // d) * d * m + u % d + d * r``, ``r < m``."""
    from tvm import relax

    n, h, wd, c = shape
    _, oh, ow, k = out_shape
    m, alpha = tile.m, tile.alpha
    dh = dilation
    # ceilings as (a + b - 1) // b: TVM's analyzer proves little of -(-a // b) (symbolic sizes)
    th, tw = (oh + m * dh - 1) // (m * dh) * dh, (ow + m - 1) // m
    tiles = n * th * tw
    static = all(isinstance(v, int) for v in (n, h, wd))
    # a symbolic height or width over more than one image (a symbolic batch, or a static one of 2 or more): the
    # images stacked into one tall image (see ``stacked``)
    stack = not (isinstance(h, int) and isinstance(wd, int)) and not (isinstance(n, int) and n == 1)
    if stack:
        # each image in a slot of q tile rows (its rows, the padding around them, zeros to the slot's end); the
        # tile rows of all slots are one image's: tile row u of image b is slot row u - b * q
        q = (oh + 2 + m - 1) // m
        th, tiles = n * q, n * q * tw
    # symbolic sizes: the GEMM's rows (tiles) rounded up to the matmul rule's register tile, as
    # :mod:`.dynamic_matmul` does (a bare split of a symbolic row axis is 2.9x slower); the extra tiles read the
    # last image again or zero rows below it (see ``pixel``), and the output transform never reads them
    rt = choose_tiles(k, None, tinfo)[1]
    rows = tiles if static else round_up(tiles, rt)
    gemm = (gemm_factory or (lambda *sizes: fp32_gemm(*sizes, tinfo)))(alpha * alpha, c, k, rows)
    packed = gemm.pack(transform_weights(w, tile))

    # Each transform is separable (B^T d B: rows, then columns), computed in two blocks of alpha (or m)
    # cases each: as one block of alpha^2 cases, F(4x4, 3x3)'s 36 unrolled copies of a 36-case expression
    # took 2.7 s per kernel to simplify and compile.  The rule computes the first block per channel vector.
    # the padded image: rows up to the last tile's patch (a symbolic height: also those the extra tiles read)
    extra = 0 if static or isinstance(th, int) else (rt + dh) * m
    pad_after = [0, th * m + 2 * dh - h - pad[0] + extra, tw * m + 2 - wd - pad[1], 0]

    def coordinate(u: Any, i: Any, d: int = 1) -> Any:
        """Padded coordinate of patch element ``i`` of tile ``u`` along an axis of dilation ``d``."""
        return m * u + i if d == 1 else (u // d) * (d * m) + u % d + d * i

    def stacked(x: Any) -> Any:
        """The images one above the other, each padded in a slot of ``q * m`` rows, then zero rows for the extra
        tiles: one tall image (batch 1), so the transforms are the single-image ones and need no division by a
        symbolic tile count (with one, TVM's simplifier took 8.5 s per transform, see ``pixel``); only this copy
        divides, by the slot height, once per row."""
        slot = q * m
        zero = tirx.const(0, x.dtype)

        def value(_: Any, r: Any, col: Any, ch: Any) -> Any:
            b, y, xx = r // slot, r % slot - pad[0], col - pad[1]
            inside = tirx.all(r < n * slot, y >= 0, y < h, xx >= 0, xx < wd)
            return tirx.if_then_else(inside, x[tirx.min(b, n - 1), tirx.max(tirx.min(y, h - 1), 0),
                                               tirx.max(tirx.min(xx, wd - 1), 0), ch], zero)
        return te.compute((1, n * slot + (rt + 1) * m, tw * m + 2, c), value, name="winograd_stack")

    def f_input(x: Any) -> Any:
        xp = topi.nn.pad(x, [0, pad[0], pad[1], 0], pad_after, name="pad_temp") \
            if static else x  # symbolic: padded by a kernel of its own (see below)

        def pixel(t: Any, i: Any, j: Any, ch: Any) -> Any:
            if stack:  # the tall image's tile rows: no image index
                value = xp[0, coordinate(t // tw, i), coordinate(t % tw, j), ch]
            elif static or isinstance(th, int):  # the extra tiles of a symbolic batch read the last image
                b = t // (th * tw) if static else tirx.min(t // (th * tw), n - 1)
                value = xp[b, coordinate(t // tw % th, i, dh), coordinate(t % tw, j), ch]
            else:
                # a symbolic height, one image (:func:`applies`): the tile row is t // tw, no % th (with a
                # symbolic th, TVM's simplifier took 8.5 s per transform on it, 1.3 s without); the extra tiles
                # read zero rows the pad kernel adds below the image
                value = xp[0, coordinate(t // tw, i, dh), coordinate(t % tw, j), ch]
            return value if load is None else load(value)

        # rows[i, b] = sum_j B^T[b, j] d[i, j]
        rows_ = te.compute((alpha, alpha, rows, c), lambda i, b, t, ch: _select(
            b, [_combo(tile.bt[b_], lambda j: pixel(t, i, j, ch)) for b_ in range(alpha)]), name=ROWS)
        # V[a * alpha + b] = sum_i B^T[a, i] rows[i, b]
        return te.compute((alpha * alpha, rows, c), lambda e, t, ch: gemm.store(_select(
            e // alpha, [_combo(tile.bt[a], lambda i: rows_[i, e % alpha, t, ch]) for a in range(alpha)])),
            name="winograd_input")

    def f_output(mm: Any) -> Any:
        # cols[a, j] = sum_b A^T[j, b] M[a * alpha + b]
        cols = te.compute((alpha, m, tiles, k), lambda a, j, t, kk: _select(
            j, [_combo(tile.at[j_], lambda b_: gemm.result(mm[a * alpha + b_, t, kk])) for j_ in range(m)]),
            name=COLS)

        def body(b: Any, y: Any, x: Any, kk: Any) -> Any:
            t = (b * q + y // m) * tw + x // m if stack else b * (th * tw) + y // m * tw + x // m
            # Y[i, j] = sum_a A^T[i, a] cols[a, j]
            return _select(y % m, [_combo(tile.at[i], lambda a: cols[a, x % m, t, kk]) for i in range(m)])
        # the rule splits the rows and columns by the tile size it reads here; a dilated height's rows come
        # tile by tile (see below)
        return te.compute((n, oh if dh == 1 else th * m, ow, k), body, name="winograd_output",
                          attrs={TILE_ATTR: m})

    def f_rows(z: Any) -> Any:
        """A dilated height's output rows from the transform's, which come tile by tile: row ``u * m + r``
        of ``z`` is output row ``(u // d) * d * m + u % d + d * r`` (the inverse of ``coordinate``)."""
        def row(y: Any) -> Any:
            return ((y // (dh * m)) * dh + y % dh) * m + y % (dh * m) // dh
        return te.compute((n, oh, ow, k), lambda b, y, x, kk: z[b, row(y), x, kk], name="winograd_rows")

    # Fusion: FuseOps would merge the injective transforms with their injective neighbours (a layout
    # transpose into the input transform, one conv's output transform with the next conv's input transform),
    # which no schedule runs well.  The input transform is opaque: it fuses with nothing.  The output
    # transform is "out-elementwise fusable", like a convolution: its bias, ReLU and residual add fuse after it.
    if stack:
        data = bb.emit(bb.call_te(stacked, data, primfunc_name_hint="winograd_pad"))
    elif not static:
        # symbolic sizes: the padded copy is a kernel of its own, not a block of the transform's (TVM cannot
        # prove that such a block covers what the transform reads at t // tw % th, so compute_at refuses the
        # scope; a clamped, masked read instead took the TIR simplifier 2 min per conv)
        data = bb.emit(bb.call_te(topi.nn.pad, data, [0, pad[0], pad[1], 0], pad_after,
                                  primfunc_name_hint="winograd_pad"))
    v = bb.emit(bb.call_te(f_input, data, primfunc_name_hint="winograd_input",
                           primfunc_attrs={"op_pattern": _OPAQUE}))
    mm = bb.emit(bb.call_te(gemm.compute, v, relax.const(packed), primfunc_name_hint="winograd_gemm"))
    out = bb.call_te(f_output, mm, primfunc_name_hint="winograd_output",
                     primfunc_attrs={"op_pattern": _OUT_ELEMWISE_FUSABLE})
    # A dilated height: its rows in place by a gather of their own (the bias, ReLU... fuse into it).  Placed by
    # the output transform itself, a row of a tile holds outputs d rows apart, and TVM's region analysis of
    # the transform's first pass at (y // (d * m)) * d + y % d came out non-constant (no unrolled schedule)
    return out if dh == 1 else bb.call_te(f_rows, bb.emit(out), primfunc_name_hint="winograd_dilated_rows")


#: F(4x4, 3x3) where both output sides are at least this (its 4x4 tiles waste little) ...
F4_MIN_SIDE = 14
#: ... and its U (36 / 9 = 4x the weights) stays this small
F4_MAX_WEIGHT_BYTES = 4 << 20


def choose(out_shape: tuple, in_channels: int) -> Tile:
    """The algorithm for a conv of NHWC output ``out_shape`` over ``in_channels``."""
    _, oh, ow, k = out_shape
    sides = [v for v in (oh, ow) if isinstance(v, int)]  # a symbolic side (dynamic image) counts as large
    if min(sides, default=F4_MIN_SIDE) >= F4_MIN_SIDE and F4.alpha ** 2 * in_channels * k * 4 <= F4_MAX_WEIGHT_BYTES:
        return F4
    return F2
