"""Sums over many elements in two stages: blocks of ~4096 elements first, then the sum of the blocks' sums.

TVM 0.27 lowers ``R.sum`` (and ``R.mean``, ``R.variance``, what ``GlobalAveragePool``, ``ReduceL1/L2``,
``ReduceSumSquare``, ``ReduceLogSumExp`` import as, and the denominators of ``R.nn.softmax`` /
``log_softmax``) to one ``te.sum``: a single fp32 accumulator that every element is added to in turn.  Its
error grows with the count (worst case n * 2^-24 relative): once the running sum reaches 2^24 times an
element, adding one more rounds back to the same value, so ``ReduceSum`` of 2^25 ones returned 16,777,216
(onnxruntime: 33,554,432), ``ReduceMean`` of them 0.5, at opt levels 0-3.  Nothing of TVM's splits it:
levels 0-2 run the plain loop, forgekit's rules (level 3) rfactor row reductions into vector lanes only when
the reduction is not the kernel's output (``PoolRule`` takes a lone sum and keeps one accumulator per output),
and level 4's reassociation lets LLVM keep 16-64 partial sums, which only moves the stall to 2^28-2^30.

Here a float sum whose reduced extent exceeds :data:`LONG` becomes (1) a kernel that sums blocks of about
:data:`BLOCK` elements of the reduced axes into a tensor of partial sums, then (2) the sum of
those (split again if still long; a mean divides in that last kernel, as TOPI's mean does).  Softmax and
log_softmax become max, exp, the split sum and the normalization, as TOPI computes them; an ``AveragePool``
whose window is the whole map is the mean it is.  The error is then ~(BLOCK + n / BLOCK) * eps instead of
n * eps; on uniform [0, 1) data (numpy, sequential fp32): 2^20 elements 3.1e-5 -> 4.4e-7, 2^24
1.1e-5 -> 7.0e-8, and 2^25 ones are exact.  The blocks split the innermost reduced axis that makes them
long enough, by a divisor of its extent where one exists, else in even blocks whose tail is masked by a
clamped read (no load past the end; also for a symbolic extent); a block of a row keeps 16 interleaved
partial sums (vector loads, see :func:`block_sums`).

:data:`LONG` = 2^14: below it the sequential error is that of 2^14 additions (3.5e-7 measured on uniform
data, about what a two-stage sum gives), and every reduction of an ordinary model stays as it was (a ResNet's
7x7 pool, BERT's 128-512 softmax rows, layer norms of 768-4096, EfficientNet's 112x112 squeeze = 12544).
A symbolic extent is split only when its ``--dynamic`` upper bound exceeds LONG: the split costs its kernels
at every size (a dynamic 7x7 pool: 0.07 -> 0.19 ms; a dynamic BERT softmax [1, 12, L, L] at L = 128:
0.86 -> 1.43 ms with fixed 4096 blocks), too much to pay for a length that is usually short; bound it
(``--dynamic L=1..100000``) to have it split, pin it to decide by its size.  A split symbolic sum also
compiles slower at levels 3-4 (ReduceSum over L <= 2^23: 0.9 -> 7.4 s, the masked blocks' index arithmetic).

Why not TVM's own: Relax has no blocked-sum pass, ``rfactor`` is a schedule primitive (levels 0-2 schedule
nothing, and the rules' rfactor partial sums are per vector lane: 16 of them still stall at 2^28); TOPI's
``sum`` has no pairwise or blocked variant.
"""

from __future__ import annotations

from typing import Any

#: a float sum over more elements than this is summed in blocks (see the module docstring)
LONG = 1 << 14
#: elements summed by one stage-1 partial sum (~sqrt(2^24): 2^24 elements give 4096 + 4096 additions)
BLOCK = 1 << 12
#: a symbolic axis over inner sums at least this long is split one index per block (no mask, see :func:`plan`)
WHOLE_ROWS = 64
#: partial sums per block of a row (the split axis innermost): one vector of fp32 on AVX-512 (see block_sums)
LANES = 16
#: at level 3+, a softmax / log_softmax over a static innermost axis up to this long stays one kernel: the CPU
#: legalization (``backends/cpu/fast_math.py``) pads the row to whole vectors and the row rule keeps one partial
#: sum per lane (4+ lanes: <= LONG terms each, the error LONG allows); DLight's GPU reduction sums across
#: threads.  Split, PP-OCRv6 rec's [40, 18710] softmax took 3 kernels and 3 passes over the rows (4.0 ms alone;
#: onnxruntime 0.35), whole 0.61 ms.  Levels 0-2 schedule nothing, so they split as before.
WHOLE_ROW = 4 * LONG
_SUM_OPS = ("relax.sum", "relax.mean", "relax.variance")
_SOFTMAX_OPS = ("relax.nn.softmax", "relax.nn.log_softmax")
_MEAN_OPS = ("relax.nn.avg_pool2d",)


def _int(dim: Any) -> int | None:
    try:
        return int(dim)
    except TypeError:  # a symbolic extent
        return None


def _upper(dim: Any, bounds: dict[str, int]) -> int | None:
    """``dim``'s value or, symbolic, its largest under the function's ``--dynamic`` bounds (None: unbounded)."""
    static = _int(dim)
    if static is not None:
        return static
    import tvm

    free = tvm.tirx.analysis.undefined_vars(dim)
    if any(v.name not in bounds for v in free):
        return None
    analyzer = tvm.sym.Analyzer()
    for v in free:
        analyzer.update(v, tvm.sym.ConstIntBound(1, bounds[v.name]))
    upper = analyzer.const_int_bound(dim).max_value
    return None if upper >= (1 << 62) else int(upper)


def _divisor(extent: int, want: int) -> int | None:
    """The largest divisor of ``extent`` in [want / 4, want], a multiple of :data:`LANES` if one is: whole
    blocks, no mask."""
    found = [d for d in range(want, max(1, want // 4) - 1, -1) if extent % d == 0]
    return next((d for d in found if d % LANES == 0), found[0] if found else None)


def plan(shape: list[Any], axes: list[int], bounds: dict[str, int]) -> tuple[int, int, bool] | None:
    """How to split a sum of a ``shape`` tensor over ``axes`` (sorted, non-negative): ``(axis, block, exact)``:
    stage 1 sums the reduced axes after ``axis`` and ``block`` indices of ``axis`` per block (``exact``:
    ``block`` divides its extent); None when the sum is short enough or symbolic without a ``--dynamic`` bound
    (see the module docstring).

    A symbolic axis whose inner axes already sum :data:`WHOLE_ROWS`+ elements (a mean over ``H x W`` of a
    detector with ``--dynamic``) is split one index per block: stage 1 sums each row whole, stage 2 the rows,
    no masked tail.  Blocks of a symbolic size over it (``ceil(H / ceil(H / 8))`` rows, masked) made LLVM's
    codegen take 25 s per kernel: PP-OCRv6 det at dynamic H, W <= 2048 compiled in 10-12 min, 6 such pools
    times 3 portable levels (66 s before the split came)."""
    total = 1
    for a in axes:
        upper = _upper(shape[a], bounds)
        if upper is None:
            total = None
            break
        total *= upper
    if total is None or total <= LONG:
        return None
    inner = 1  # elements of the fully summed inner axes (a symbolic one at its --dynamic largest)
    for a in reversed(axes):
        extent = _int(shape[a])
        upper = _upper(shape[a], bounds)  # known: ``total`` was
        if inner * upper <= BLOCK:
            inner *= upper
            continue
        want = max(1, BLOCK // inner)
        if want == 1 or (extent is None and inner >= WHOLE_ROWS):
            return a, 1, True
        exact = _divisor(extent, want) if extent is not None else None
        return (a, exact, True) if exact else (a, want, False)
    return None


def block_sums(x: Any, axes: list[int], axis: int, block: int, exact: bool, lanes: bool, maximum: bool) -> Any:
    """Stage 1 as a TE compute: the shape of ``x`` with ``axis`` in blocks of ``block`` (block j: elements
    j * block ... (j + 1) * block - 1) and the reduced axes after it summed, kept as 1; ``maximum``: their
    maximum (a softmax's, exact either way).  ``lanes`` (``axis`` innermost, ``block`` a multiple of LANES):
    each block keeps LANES partial sums of interleaved elements, ``block_sum[j * LANES + l] = sum_k
    x[j * block + k * LANES + l]``, so each step loads one contiguous vector: the pool rule that takes a lone
    sum vectorizes across the output (the blocks), and one value per block made it gather 16 rows 16 KB apart
    (ReduceSum [1, 2^22] at level 3: 4.2 ms with one sum per block, 1.6 ms with 16; one accumulator: 5.1 ms).
    """
    from tvm import te, tirx

    shape = list(x.shape)
    after = [a for a in axes if a > axis]
    out_shape = [1 if a in after else s for a, s in enumerate(shape)]
    whole = isinstance(block, int) and block == 1  # the axis is kept whole: stage 1 sums the axes after it
    blocks = shape[axis] if whole else tirx.indexdiv(shape[axis] + block - 1, block)
    out_shape[axis] = blocks * LANES if lanes else blocks
    steps = tirx.indexdiv(block, LANES) if lanes else block
    k = None if whole else te.reduce_axis((0, steps), name="k")
    rest = [te.reduce_axis((0, shape[a]), name=f"r{a}") for a in after]
    combine = te.max if maximum else te.sum
    identity = tirx.min_value(x.dtype) if maximum else tirx.const(0, x.dtype)

    def partial(*idx: Any) -> Any:
        index = list(idx)
        for a, r in zip(after, rest):
            index[a] = r
        if k is None:
            return combine(x(*index), axis=rest)
        if lanes:
            j, lane = tirx.indexdiv(idx[axis], LANES), tirx.indexmod(idx[axis], LANES)
            pos = j * block + k * LANES + lane
        else:
            pos = idx[axis] * block + k
        if exact:
            index[axis] = pos
            value = x(*index)
        else:  # the last block's tail: a clamped (in-bounds) read, masked to the identity
            index[axis] = tirx.min(pos, shape[axis] - 1)
            value = tirx.Select(pos < shape[axis], x(*index), identity)
        return combine(value, axis=[k, *rest])

    return te.compute(out_shape, partial, name="block_max" if maximum else "block_sum")


def _axes(call: Any, ndim: int) -> list[int]:
    axis = call.attrs.axis
    if axis is None:
        return list(range(ndim))
    return sorted({int(a) % ndim for a in axis})


def _global_pool_axes(attrs: Any, shape: list[Any]) -> list[int] | None:
    """The axes an ``avg_pool2d`` averages whole (``AveragePool`` with a window as large as the map: a mean), or
    None when it is a sliding window.  Windows of one step are fine on the other axis."""
    layout = str(attrs.layout)
    if layout not in ("NCHW", "NHWC") or str(attrs.out_layout) != layout or any(int(p) for p in attrs.padding) \
            or any(int(d) != 1 for d in attrs.dilation):
        return None
    axes = []
    for axis, size, stride in zip((layout.index("H"), layout.index("W")), attrs.pool_size, attrs.strides):
        if _int(shape[axis]) == int(size):
            axes.append(axis)
        elif int(size) != 1 or int(stride) != 1:
            return None
    return axes or None


def _reduced(call: Any, shape: list[Any]) -> tuple[list[int], bool] | None:
    """The axes ``call`` sums over and whether it keeps them."""
    name, ndim = call.op.name, len(shape)
    if name in _SOFTMAX_OPS:
        return [int(call.attrs.axis) % ndim], True
    if name == "relax.nn.avg_pool2d":
        axes = _global_pool_axes(call.attrs, shape)
        return (axes, True) if axes else None
    return _axes(call, ndim), bool(call.attrs.keepdims)


def _is_float(expr: Any) -> bool:
    return str(getattr(expr.ty, "dtype", "")).startswith(("float", "bfloat"))


def _rewriter(mod: Any) -> Any:
    """A Relax mutator (built on first use: TVM's decorator needs TVM) that splits the long sums of ``mod``."""
    from tvm import relax, tirx, topi
    from tvm.relax.expr_functor import PyExprMutator, mutator

    R = relax.op

    @mutator
    class LongSums(PyExprMutator):
        bounds: dict[str, int] = {}
        changed = False
        whole_softmax_rows = False

        def long_sum(self, x: Any, axes: list[int], keepdims: bool, count: Any = None, maximum: bool = False
                     ) -> Any:
            """``R.sum(x, axes, keepdims)`` (divided by ``count``: a mean; ``maximum``: ``R.max``), in stages
            when it is long."""
            shape = list(x.ty.shape.values)
            how = plan(shape, axes, self.bounds)
            if how is None and count is None:
                return (R.max if maximum else R.sum)(x, axes, keepdims)
            if how is None:  # the last stage and the division in one kernel, as TOPI's mean (FuseOps fuses
                # nothing after a reduction: a separate divide was a third kernel, +20 % on a 7x7 pool)
                call = self.builder_.call_te(lambda p, c: topi.divide(topi.sum(p, axes, keepdims), c), x, count,
                                             primfunc_name_hint="mean")
                if not isinstance(count, (int, tirx.IntImm)):
                    # a count of a symbolic size (a global mean over a dynamic image) binds its variables from a
                    # scalar argument, which FuseTIR cannot merge with a kernel fused after it: an int8 build's
                    # requantize of the mean failed to compile ("VarRemapGet(source) == nullptr"; an SE block of
                    # PP-OCRv6 det).  Opaque, it stays a kernel of its own; what follows is elementwise on C values
                    gv = call.args[0]
                    self.builder_.update_func(gv, self.builder_.get()[gv].with_attr("op_pattern", 8))
                return call
            axis, block, exact = how
            if not exact:  # as many blocks as ``block`` needs, made as even as they go: the masked tail is shorter
                # than their count (a fixed 4096 on a symbolic length of 128 summed 32x the elements); passed in,
                # a symbolic size is one scalar, not a division per element
                count_blocks = tirx.indexdiv(shape[axis] + block - 1, block)
                block = tirx.indexdiv(shape[axis] + count_blocks - 1, count_blocks)
                if isinstance(block, tirx.IntImm):
                    block = -(-int(block) // LANES) * LANES if axis == len(shape) - 1 else int(block)
            # symbolic blocks keep the simple layout (the lanes' index arithmetic on them: 18 s to compile)
            lanes = axis == len(shape) - 1 and isinstance(block, int) and block % LANES == 0
            call = self.builder_.call_te(block_sums, x, axes, axis, block, exact, lanes, maximum,
                                         primfunc_name_hint="block_max" if maximum else "block_sum")
            # a reduction (kCommReduce) whatever its index arithmetic: AnnotateTIROpPattern calls a read of
            # x[j * block + k] out-fusable (like a conv), and FuseOps then kept softmax's exp out of it
            # (a 16 MB write and read per 2^22 row)
            gv = call.args[0]
            self.builder_.update_func(gv, self.builder_.get()[gv].with_attr("op_pattern", 3))
            partial = self.builder_.emit(call)
            blocks = partial.ty.shape.values[axis]
            if not isinstance(blocks, (tirx.IntImm, tirx.Var)):
                # ceil(L / block) of a symbolic L: a variable of its own, or the next kernel's buffer shape
                # names L, which TIR cannot bind from it ("Invalid use of undefined variable L")
                shape = list(partial.ty.shape.values)
                shape[axis] = tirx.Var("blocks", "int64")
                partial = self.builder_.match_cast(partial, relax.TensorType(shape, x.ty.dtype))
            return self.long_sum(partial, axes, keepdims, count, maximum)

        def long_mean(self, x: Any, axes: list[int], keepdims: bool) -> Any:
            count = 1
            for a in axes:
                count = count * x.ty.shape.values[a]
            # the count is an argument: symbolic, it is not in the last stage's shape
            return self.long_sum(x, axes, keepdims, count)

        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            name = getattr(call.op, "name", None)
            if name not in _SUM_OPS + _SOFTMAX_OPS + _MEAN_OPS or not call.args or not _is_float(call.args[0]):
                return call
            x = call.args[0]
            shape = getattr(x.ty, "shape", None)
            if not isinstance(shape, relax.ShapeExpr):
                return call
            reduced = _reduced(call, list(shape.values))
            if reduced is None or plan(list(shape.values), reduced[0], self.bounds) is None:
                return call
            axes, keepdims = reduced
            if self.whole_softmax_rows and name in _SOFTMAX_OPS and axes == [len(shape.values) - 1] \
                    and str(x.ty.dtype) == "float32" and (_int(shape.values[-1]) or WHOLE_ROW + 1) <= WHOLE_ROW:
                return call
            self.changed = True
            emit = self.builder_.emit
            if name == "relax.sum":
                return self.long_sum(x, axes, keepdims)
            if name in ("relax.mean", "relax.nn.avg_pool2d"):
                return self.long_mean(x, axes, keepdims)
            if name == "relax.variance":  # as TOPI: mean((x - mean(x))^2)
                dev = emit(R.subtract(x, emit(self.long_mean(x, axes, True))))
                return self.long_mean(emit(R.multiply(dev, dev)), axes, keepdims)
            # softmax as TOPI computes it: exp(x - max) / sum(exp(x - max)); log_softmax: x - max - log(sum).
            # exp is computed again by the normalization, so that it fuses into both kernels instead of being
            # a 16 MB write and two reads per 2^22 row.  Still 3 passes over the row where TVM's softmax kernel
            # makes them in one, and 5 kernels: softmax [1, 2^22] 6.5 -> 6.9 ms, [1, 2^15] 0.062 -> 0.086 ms
            # at level 3 (a serial max and a stored exp: 12.4 ms at 2^22).
            top = emit(self.long_sum(x, axes, True, maximum=True))  # exact either way: in blocks for speed
            total = emit(self.long_sum(emit(R.exp(emit(R.subtract(x, top)))), axes, True))
            if name == "relax.nn.softmax":
                return R.divide(emit(R.exp(emit(R.subtract(x, top)))), total)
            return R.subtract(emit(R.subtract(x, top)), emit(R.log(total)))

    return LongSums(mod)


def _bounds(func: Any) -> dict[str, int]:
    attrs = getattr(func, "attrs", None)
    upper = attrs["tir_var_upper_bound"] if attrs is not None and "tir_var_upper_bound" in attrs else {}
    return {str(k): int(v) for k, v in upper.items()}


def _has_candidate(func: Any) -> bool:
    from tvm import relax

    found = []

    def visit(expr: Any) -> None:
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", None) in _SUM_OPS + _SOFTMAX_OPS + _MEAN_OPS:
            found.append(expr)

    relax.analysis.post_order_visit(func, visit)
    return bool(found)


def split_long_sums(mod: Any, whole_softmax_rows: bool = False) -> Any:
    """Every long float sum of ``mod``'s Relax functions in two (or more) stages (see the module docstring);
    ``whole_softmax_rows``: not the softmax rows of up to :data:`WHOLE_ROW` (level 3+)."""
    from tvm import relax

    funcs = [(gv, f) for gv, f in mod.functions_items() if isinstance(f, relax.Function) and _has_candidate(f)]
    if not funcs:
        return mod
    rewriter = _rewriter(mod)
    rewriter.whole_softmax_rows = whole_softmax_rows
    for gv, func in funcs:
        rewriter.bounds = _bounds(func)
        rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    return rewriter.builder_.finalize() if rewriter.changed else mod


def long_reductions_pass(whole_softmax_rows: bool = False) -> Any:
    """:func:`split_long_sums` as a module pass."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="forgekit.LongReductions")
    def rewrite(mod: Any, _ctx: Any) -> Any:
        return split_long_sums(mod, whole_softmax_rows)

    return rewrite
