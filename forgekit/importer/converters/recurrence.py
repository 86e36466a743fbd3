"""The time loop of an LSTM / GRU / RNN direction as one TIR kernel.

Unrolled, a recurrence is one matmul and a few elementwise kernels per time step: the graph, the compile
time and the library grow with the sequence length (a two-GRU audio model over 300 frames took 579 s to
compile into 11 MB), and the length cannot be dynamic.  Here the input projection ``X @ W^T`` stays one
big matmul for all steps, and the recurrence ``h_t = f(xw_t + h_{t-1} @ R^T)`` is a single kernel with a
serial loop over time: its size and compile time do not depend on the length, which may be symbolic.

The kernel is written as TVMScript text for the configuration at hand and parsed; it is marked scheduled
(its loops are already the schedule: the ``h @ R^T`` product broadcasts ``h[k]`` over a contiguous,
vectorized row of ``R^T``) and opaque, so the schedule rules and operator fusion leave it alone.

Covered: the default activations, no ``clip``, no peepholes, no ``input_forget`` and no ``sequence_lens``
(what PyTorch and Keras exports produce); anything else is unrolled by :mod:`.rnn` as before.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

#: Vector width of the inner loops (elements): 16 fp32 lanes is one AVX-512 register; on narrower
#: targets LLVM splits it.
_LANES = 16


def supported(kind: str, attr: dict, acts: list, has_seq_lens: bool, has_peepholes: bool) -> bool:
    """Whether the loop kernel computes this recurrence exactly as ONNX defines it."""
    defaults = {"lstm": ("sigmoid", "tanh", "tanh"), "gru": ("sigmoid", "tanh"), "rnn": ("tanh",)}[kind]
    per_dir = len(defaults)
    names = tuple(a[0] for a in acts)
    return (attr.get("clip") is None and not int(attr.get("input_forget", 0)) and not has_seq_lens
            and not has_peepholes and all(names[i:i + per_dir] == defaults for i in range(0, len(names), per_dir)))


#: tanh(x) ~ p(x) / q(x) on [-9, 9] (Eigen's and TVM's fast_tanh rational approximation, relative error
#: below 1e-6): vectorizes, where ``T.tanh`` / ``T.exp`` on vectors become scalar libm calls.  The
#: activations were 2/3 of the GRU loop's time with libm.
_TANH_P = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
           1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03)
_TANH_Q = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03)


def _f(v: float) -> str:
    return f"T.float32({v!r})"


def _horner(coefs: tuple[float, ...], x2: str) -> str:
    expr = _f(coefs[0])
    for c in coefs[1:]:
        expr = f"({expr}) * {x2} + {_f(c)}"
    return expr


def _tanh(e: str) -> list[str]:
    """Statements replacing the buffer element ``e`` by its tanh."""
    x2 = f"({e} * {e})"
    return [f"{e} = T.max(T.min({e}, {_f(9.0)}), {_f(-9.0)})",
            f"{e} = {e} * ({_horner(_TANH_P, x2)}) / ({_horner(_TANH_Q, x2)})"]


def _sigmoid(e: str) -> list[str]:
    """sigmoid(x) = (1 + tanh(x / 2)) / 2, in place."""
    return [f"{e} = {e} * {_f(0.5)}", *_tanh(e), f"{e} = {e} * {_f(0.5)} + {_f(0.5)}"]


def _loop(extent: int, indent: str, var: str = "j") -> tuple[str, str, str]:
    """(header lines, index, body indentation) of a loop over ``extent`` elements: vectorized 16 at a time
    when 16 divides it, else as one vector."""
    if extent % _LANES == 0 and extent > _LANES:
        return (f"{indent}for {var}o in range({extent // _LANES}):\n{indent}    for {var}i in T.vectorized({_LANES}):",
                f"{var}o * {_LANES} + {var}i", indent + "        ")
    return f"{indent}for {var}i in T.vectorized({extent}):", f"{var}i", indent + "    "


def panel(cols: int) -> int:
    """Columns per panel of a recurrent weight matrix of ``cols`` columns: a block of 64 columns (4 AVX-512
    registers: 4 independent FMA chains, 1.3x over one) stays in registers over the rows."""
    return next((c for c in (4 * _LANES, _LANES) if cols % c == 0), cols)


def _matvec(out: str, vec: str, mat: str, rows: int, cols: int, indent: str, parallel: bool = False) -> list[str]:
    """``out[0:cols] = vec[0:rows] @ mat`` (``out``/``vec``: element templates with ``{j}`` the column and
    ``{k}`` the row; ``mat``: the weights packed in :func:`panel` column panels, ``[cols / c, rows, c]``, with
    ``{p}`` the panel, ``{k}`` the row and ``{c}`` the column in it); ``parallel``: the panels split over the
    threads, each thread's share visited in the order of :func:`_snake` (the kernel defines ``n_thr`` and the
    step ``s``)."""
    chunk, n = panel(cols), cols // panel(cols)
    i2 = indent + "    "
    acc = out.format(j=f"jo * {chunk} + ji")
    head = [f"{indent}for jo in range({n}):"]
    if parallel:
        head = [f"{indent}for jp in T.parallel({n}):", f"{i2}jo = {_snake('jp', n)}"]
    return [*head, f"{i2}for ji in T.vectorized({chunk}):", f"{i2}    {acc} = T.float32(0)",
            f"{i2}for k in range({rows}):", f"{i2}    for ji in T.vectorized({chunk}):",
            f"{i2}        {acc} = {acc} + {vec.format(k='k')} * {mat.format(k='k', p='jo', c='ji')}"]


#: The pool's thread count, read once per call of a kernel whose steps split over the threads: TVM's
#: ``TVMBackendParallelLaunch`` gives thread ``i`` of ``n`` the iterations ``[i * ceil(N / n), ...)`` of a
#: parallel loop of ``N`` (codegen_cpu.cc), and forgekit's Engine resizes the pool to the free cores before each
#: inference (``runtime.loader.fit_threads_to_load``), so the split is known only at run time.
_THREADS = "    n_thr = T.max(T.call_packed(\"runtime.NumThreads\", dtype=\"int32\"), 1)"


def _snake(it: str, n: int) -> str:
    """The panel a thread computes at iteration ``it`` of a parallel loop over ``n`` panels: ``it`` itself at
    even steps, and at odd steps the mirror of ``it`` within this thread's share (TVM's static split, see
    :data:`_THREADS`), so each thread reads first the panels it read last, while they are still in its L2.

    Visited in the same order every step, a thread's share of the weights (2 MB of an LSTM at H=512 on 2
    threads) is a cyclic scan over a cache it does not fit, which misses on every line whatever the cache
    keeps; back and forth, a share near the L2's size is mostly hit.  Measured on a BiLSTM (H=512, 40 steps,
    2 threads, a Xeon with 2 MB of L2 per core): the loop kernel 3.48 -> 2.33 ms.  Any order computes every
    panel exactly once with the same sums, so the results are the same to the bit; when the pool's split
    differs from the one assumed (a pool resized while a kernel runs), only the reuse is lost."""
    share = f"(({n} + n_thr - 1) // n_thr)"
    first = f"({it} // {share} * {share})"
    last = f"(T.min({first} + {share}, {n}) - 1)"
    return f"T.if_then_else(s % T.int64(2) == T.int64(0), {it}, {first} + {last} - {it})"


def pack_panels(bb: Any, w: Any) -> Any:
    """``w [D, rows, cols]`` (a recurrent weight matrix, transposed) in the kernel's panel layout
    ``[D, cols / c, rows, c]`` (:func:`panel`): each panel is one contiguous stream.

    In the row-major matrix a panel's rows are 256 bytes, ``cols * 4`` bytes apart: 8 KB at H=512 for an
    LSTM, a page or more, which the hardware prefetchers do not follow across, so each step waited on its 4 MB
    of weights line by line.  Measured on a BiLSTM (H=512, input 1024, 8 steps, 2 threads, this Xeon): the
    loop kernel ~3.0 -> ~2.1 ms, the layer 2.88 -> 2.23 against onnxruntime's 1.51 (which pre-packs its
    weights the same way, MlasGemmPackB)."""
    d, rows, cols = (int(v) for v in w.ty.shape.values)
    c = panel(cols)
    op = relax.op
    return bb.emit(op.permute_dims(op.reshape(w, [d, rows, cols // c, c]), [0, 2, 1, 3]))


def _quantize_state(h: int) -> list[str]:
    """Statements (inside the time loop) quantizing ``hn[d]`` into ``hq[d]`` as onnxruntime's
    ``GetQuantizationParameter`` + ``MlasQuantizeLinear`` do (the formulas of
    :class:`~.quant.DynamicQuantizeLinear`), less the zero point: ``qs[d]`` = (lo, hi, scale, zp)."""
    i, f0, f255 = "            ", "T.float32(0)", "T.float32(255)"
    head, j, body = _loop(h, i + "    ", "k")
    e = f"hn[d, b, {j}]"
    # the range: a scalar loop (a reduction into one element must not be vectorized)
    return [f"{i}qs[d, 0] = {f0}", f"{i}qs[d, 1] = {f0}", f"{i}for b in range(n_b):", f"{i}    for k in range({h}):",
            f"{i}        qs[d, 0] = T.min(qs[d, 0], hn[d, b, k])", f"{i}        qs[d, 1] = T.max(qs[d, 1], hn[d, b, k])",
            f"{i}qs[d, 2] = T.if_then_else(qs[d, 1] == qs[d, 0], T.float32(1), (qs[d, 1] - qs[d, 0]) / {f255})",
            f"{i}qs[d, 3] = T.round(T.max(T.min({f0} - qs[d, 0] / qs[d, 2], {f255}), {f0}))",
            f"{i}for b in range(n_b):", head,
            f"{body}hq[d, b, {j}] = T.max(T.min(T.round({e} / qs[d, 2]) + qs[d, 3], {f255}), {f0}) - qs[d, 3]"]


def _source(kind: str, hidden: int, dirs: tuple[bool, ...], lbr: bool, quant: str | None = None,
            split: bool = False) -> str:
    """TVMScript of one layer's loop over its directions (``dirs``: reversed or not, per direction):
    arguments ``xw [D, T, B, G*H]`` (input projections with the input biases), the recurrent weights
    transposed (GRU without linear_before_reset: ``R_zr^T [D, H, 2H]`` and ``R_h^T [D, H, H]``; else
    ``R^T [D, H, G*H]``; GRU with it also the candidate's recurrent bias ``[D, H]``), ``h0`` (and ``c0``)
    ``[D, B, H]``; results in ONNX's layout: ``y [T, D, B, H]``, last ``h`` (and ``c``) ``[D, B, H]``.

    The directions of a bidirectional layer are independent: unless ``split``, they run in parallel, one per
    thread, and each thread streams its own direction's recurrent weights every step.  Measured on a CRNN's
    BiLSTM (H=512, 40 steps, 2 threads, Zen 4): the two directions took 3.5 ms each one after the other on one
    thread, 5.0 ms together in parallel.

    ``split`` (:func:`splits_steps`): the directions run one after the other and each step's products split
    their column panels over the threads (:func:`_matvec`), so each thread streams a share of one direction's
    weights, which stays in its L2 from one step to the next, rather than all of another's.

    ``quant`` (LSTM only): onnxruntime's DynamicQuantizeLSTM, ``rt``'s dtype.  ``rt`` holds the integer
    recurrent weights less their zero points (``"int8"``, or ``"int16"`` when a zero point takes them out of
    int8's range: a quarter or half of float32's bytes, which the step streams from cache every time) and
    ``rs [D, G*H]`` their scales; every step quantizes the previous ``h`` of all the batch to uint8 with its own
    range, as onnxruntime's quantized GEMM does (:func:`_quantize_state`), so the products are the same
    integers, exact in float32, and ``g = acc * (scale_h * rs)``."""
    h, gh, nd = hidden, hidden * {"lstm": 4, "gru": 3, "rnn": 1}[kind], len(dirs)
    if all(dirs):
        t_of = "n_t - T.int64(1) - s"
    elif not any(dirs):
        t_of = "s"
    else:  # forward and reverse: direction d runs time backwards when dirs[d]
        rev = " or ".join(f"d == {i}" for i, r in enumerate(dirs) if r)
        t_of = f"T.if_then_else({rev}, n_t - T.int64(1) - s, s)"
    lstm, split_r = kind == "lstm", kind == "gru" and not lbr

    def panels(cols: int) -> str:  # a recurrent weight matrix in column panels (pack_panels)
        return f"({nd}, {cols // panel(cols)}, {h}, {panel(cols)})"

    bufs = [("xw", f"({nd}, n_t, n_b, {gh})")]
    bufs += ([("rt", panels(2 * h)), ("rh", panels(h))] if split_r else [("rt", panels(gh), quant or "float32")])
    bufs += [("rs", f"({nd}, {gh})")] if quant else []
    bufs += [("bh", f"({nd}, {h})")] if kind == "gru" and lbr else []
    bufs += [("h0", f"({nd}, n_b, {h})")] + ([("c0", f"({nd}, n_b, {h})")] if lstm else [])
    bufs += [("y", f"(n_t, {nd}, n_b, {h})"), ("hn", f"({nd}, n_b, {h})")]
    bufs += [("cn", f"({nd}, n_b, {h})")] if lstm else []
    lines = ["    n_t = T.int64()", "    n_b = T.int64()"]
    lines += [f"    {b[0]} = T.match_buffer(var_{b[0]}, {b[1]}, \"{b[2] if len(b) > 2 else 'float32'}\")" for b in bufs]
    # scratch per direction: each thread writes only its own row
    lines += [f"    g = T.alloc_buffer(({nd}, {2 * h if split_r else gh}), \"float32\")",
              f"    cc = T.alloc_buffer(({nd}, {h}), \"float32\")"]
    if quant:  # the quantized state and its range, scale and zero point
        lines += [f"    hq = T.alloc_buffer(({nd}, n_b, {h}), \"float32\")",
                  f"    qs = T.alloc_buffer(({nd}, 4), \"float32\")"]
    lines += [_THREADS] if split else []
    lines.append(f"    for d in {'T.parallel' if nd > 1 and not split else 'range'}({nd}):")
    head, j, body = _loop(h, "            ")
    lines += ["        for b in range(n_b):", head, f"{body}hn[d, b, {j}] = h0[d, b, {j}]"]
    if lstm:
        lines.append(f"{body}cn[d, b, {j}] = c0[d, b, {j}]")
    ind = "                "
    lines += ["        for s in range(n_t):", f"            t = {t_of}"]
    lines += _quantize_state(h) if quant else []
    lines += ["            for b in range(n_b):"]
    lines += _matvec("g[d, {j}]", f"{'hq' if quant else 'hn'}[d, b, {{k}}]",
                     "T.Cast(\"float32\", rt[d, {p}, {k}, {c}])" if quant else "rt[d, {p}, {k}, {c}]", h,
                     2 * h if split_r else gh, ind, split)
    head, j, body = _loop(h, ind)

    def gate(offset: int, act: Any) -> list[str]:  # g = act(xw[t] + g) at offset + j
        e = f"g[d, {offset} + {j}]"
        hr = f"{e} * (qs[d, 2] * rs[d, {offset} + {j}])" if quant else e
        return [f"{e} = xw[d, t, b, {offset} + {j}] + {hr}", *act(e)]

    def gg(offset: int) -> str:
        return f"g[d, {offset} + {j}]"

    stmts: list[str] = []
    if lstm:  # ONNX gate order i, o, f, c
        stmts += gate(0, _sigmoid) + gate(h, _sigmoid) + gate(2 * h, _sigmoid) + gate(3 * h, _tanh)
        stmts += [f"cn[d, b, {j}] = {gg(2 * h)} * cn[d, b, {j}] + {gg(0)} * {gg(3 * h)}",
                  f"cc[d, {j}] = cn[d, b, {j}]", *_tanh(f"cc[d, {j}]"), f"hn[d, b, {j}] = {gg(h)} * cc[d, {j}]"]
    elif kind == "rnn":
        stmts += gate(0, _tanh) + [f"hn[d, b, {j}] = {gg(0)}"]
    elif lbr:  # GRU, linear_before_reset: the candidate is tanh(xw_h + r * (h @ R_h^T + Rb_h))
        c = gg(2 * h)
        stmts += gate(0, _sigmoid) + gate(h, _sigmoid)
        stmts += [f"{c} = xw[d, t, b, {2 * h} + {j}] + {gg(h)} * ({c} + bh[d, {j}])", *_tanh(c),
                  f"hn[d, b, {j}] = (T.float32(1) - {gg(0)}) * {c} + {gg(0)} * hn[d, b, {j}]"]
    else:  # GRU: the candidate is tanh(xw_h + (r * h) @ R_h^T): r * h first, for every j
        stmts += gate(0, _sigmoid) + gate(h, _sigmoid) + [f"{gg(h)} = {gg(h)} * hn[d, b, {j}]"]
        lines += [head] + [body + x for x in stmts]
        lines += _matvec("cc[d, {j}]", f"g[d, {h} + {{k}}]", "rh[d, {p}, {k}, {c}]", h, h, ind, split)
        stmts = [f"cc[d, {j}] = xw[d, t, b, {2 * h} + {j}] + cc[d, {j}]", *_tanh(f"cc[d, {j}]"),
                 f"hn[d, b, {j}] = (T.float32(1) - {gg(0)}) * cc[d, {j}] + {gg(0)} * hn[d, b, {j}]"]
    stmts.append(f"y[t, d, b, {j}] = hn[d, b, {j}]")
    lines += [head] + [body + x for x in stmts]
    params = ", ".join(f"var_{b[0]}: T.handle" for b in bufs)
    return ("@T.prim_func(private=True)\n"
            f"def recurrence({params}):\n"
            "    T.func_attr({\"tirx.noalias\": True})\n" + "\n".join(lines) + "\n")


#: Recurrent weights of at least this many bytes per direction split every step over the threads.
SPLIT_STEP_BYTES = 512 << 10


def splits_steps(kind: str, hidden: int, quant: str | None = None) -> bool:
    """Whether each step splits its recurrent product over the threads (and a bidirectional layer runs its
    directions one after the other): when a direction's weights are :data:`SPLIT_STEP_BYTES` or more, so a
    step's work dwarfs a fork and join.  On one thread each step streamed all of them through one core's L2:
    a unidirectional LSTM at H=512 (4 MB, 40 steps, 2 threads, a Xeon) took 8.0 ms against onnxruntime's
    3.3, split 2.9; at H=256 (1 MB) the loop went 0.66 -> 0.54 ms; at H=128 (256 KB) splitting cost more than
    it saved (0.27 -> 0.31).  A bidirectional layer did the same with a direction per thread: a BiLSTM at
    H=512 (40 steps, 2 threads, the same Xeon with 2 MB of L2 per core) took 5.93 ms with its directions in
    parallel, 3.48 ms one after the other with the steps split, 2.33 ms with :func:`_snake`'s order as well
    (onnxruntime's whole layer, input projections included: 4.77 ms)."""
    per_element = {"int8": 1, "int16": 2}.get(quant or "", 4)
    return hidden * hidden * {"lstm": 4, "gru": 3, "rnn": 1}[kind] * per_element >= SPLIT_STEP_BYTES


def loop_kernel(kind: str, hidden: int, dirs: tuple[bool, ...], lbr: bool, quant: str | None = None,
                split: bool = False) -> Any:
    """The PrimFunc, marked scheduled and opaque (see the module docstring)."""
    func = tvm.script.from_source(_source(kind, hidden, dirs, lbr, quant, split))
    return func.with_attrs({"tirx.is_scheduled": True, "op_pattern": 8})  # 8: kOpaque, never fused


def emit_layer(bb: Any, kind: str, hidden: int, dirs: tuple[bool, ...], lbr: bool, xw: Any,
               weights: list[Any], h0: Any, c0: Any | None, quant: str | None = None) -> tuple[Any, Any, Any | None]:
    """(Y [T, D, batch, H], Y_h, Y_c [D, batch, H]) of one layer's directions, as ONNX lays them out;
    every argument stacked over the directions as :func:`_source` takes them."""
    name = (f"forgekit_{kind}_loop_h{hidden}_" + "".join("r" if r else "f" for r in dirs)
            + ("_lbr" if lbr else "") + (f"_q{quant[3:]}" if quant else ""))
    split = splits_steps(kind, hidden, quant)
    name += "_split" if split else ""
    existing = [gv for gv in bb.get().get_global_vars() if gv.name_hint == name]
    gv = existing[0] if existing else bb.add_func(loop_kernel(kind, hidden, dirs, lbr, quant, split), name)
    nd, t, batch = len(dirs), xw.ty.shape.values[1], xw.ty.shape.values[2]
    dtype = "float32"
    state = relax.TensorType([nd, batch, hidden], dtype)
    outs = [relax.TensorType([t, nd, batch, hidden], dtype), state] + ([state] if kind == "lstm" else [])
    matrices = 2 if kind == "gru" and not lbr else 1  # R^T, or GRU's R_zr^T and R_h^T
    weights = [pack_panels(bb, w) for w in weights[:matrices]] + list(weights[matrices:])
    args = [xw, *weights, h0] + ([c0] if kind == "lstm" else [])
    res = bb.emit(relax.call_tir(gv, args, outs))
    parts = [bb.emit(relax.TupleGetItem(res, i)) for i in range(len(outs))]
    return parts[0], parts[1], parts[2] if kind == "lstm" else None
