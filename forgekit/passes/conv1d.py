"""1-D convolutions as 2-D convolutions of height 1, so that every conv2d path of a backend runs them.

``conv1d(x[N, C, L], w[O, C/g, K])`` is ``squeeze(conv2d(expand_dims(x)[N, C, 1, L], w[O, C/g, 1, K]), H)``:
stride ``s``, dilation ``d`` and padding ``(a, b)`` along W, 1 / 1 / ``(0, 0)`` along H, the same groups and
``out_dtype``.  Every stride, dilation, padding (asymmetric included), group count (depthwise included) and
kernel size is the same sum; an integer conv1d (ConvInteger's) is an integer conv2d.  Max and average pool1d
become pool2d over a 1 x k window the same way.

The squeeze then sinks through the elementwise ops after the convolution (bias, ReLU, PReLU, an unfolded
batch norm's scale and shift, a gate's ``tanh * sigmoid``, a residual add: :data:`_UNARY`, :data:`_BINARY`;
:mod:`.batchnorm` folds the usual conv1d + BatchNormalization into the weights first), and an
``expand_dims`` that undoes it (the next conv1d's) cancels it: a stack of 1-D convolutions is 4-D from the
first to the last, and a squeeze is left only where a 3-D tensor is read (a slice, a transpose before an
LSTM).  Without the sinking, a squeeze right after each conv2d kept FuseOps from fusing its bias and ReLU
(a conv2d fuses only elementwise and broadcast consumers; a squeeze is injective): each epilogue was a
kernel of its own and each layer boundary a transpose out of NHWC and back.

Why: TVM 0.27 legalizes ``conv1d`` as TOPI's NCW loop nest, whose innermost output axis is the length, and
forgekit's conv rule vectorized that (a 4-long length in 16-lane vectors); no layout pass of the CPU pipeline
moves it to channels-last.  As conv2d they get NHWC, weights packed for the micro-kernel
(:mod:`forgekit.backends.cpu.packed_conv`), the bf16 and VNNI kernels and fused epilogues.  Measured on this
shared 2-core Zen 4 (timings drift; ratios are within one run):

* Silero VAD v6 (``input`` 64x576: a 256-tap/stride-128 STFT conv, four 3-tap convs over lengths of 4 to 1, a
  1x1 head), ``bench/bench_models.py --peer openvino``, 2 threads: forgekit / OpenVINO f32 1.71x -> 0.63x,
  forgekit / onnxruntime 0.68x -> 0.26x (before 2.73 ms; OpenVINO f32 1.60, onnxruntime 4.00).  Both
  artifacts in one process, alternating: 1.54 -> 0.73 ms (fp32), 2.83 -> 1.40 ms (bf16).  Its conv kernels
  (``--profile``, one run each): 1.78 -> 0.84 ms.
* Single convs, 1 thread, GFLOP/s before -> after (min of alternating runs): the STFT 39 -> 107, the 3-tap
  layers (N=64) 50 -> 77, 23 -> 87, 11 -> 86, 10 -> 100; 64 -> 64 channels, k=3, L=400: 74 -> 89; depthwise
  256 channels, k=15: 2.1 -> 21.5.  2-D references, same run: 1x1 256 -> 256 at 14x14 90, 3x3/2 128 -> 128
  at 28x28 103: the H = 1 convs run at the 2-D schedules' rate, so the rules keep their choices (batch rows
  instead of the short length as the register tile measured the same: the tile size, not its axis, binds).
* Other models, both artifacts in one process: a Whisper-style front end (80 -> 384 -> 384/2 channels, k=3, 3000
  frames, GELU) 37.3 -> 31.3 ms at 1 thread; PLCMOS v2 (one 1-D conv) 14.3 -> 13.3 ms; Silero VAD v5 at 512
  samples unchanged (0.113 ms).
* Where it loses: 1 -> 80 channels, k=251, L=16000 (a SincNet front end) 113 -> 70 GFLOP/s: 80 channels are 5
  vectors and the NHWC tile is 1 vector x 10 rows, load-bound (5-vector tiles, which :mod:`.tiling` does not
  offer any conv, measured 102); and a large NCW model output is transposed out of NHWC by a slow kernel (a
  1 -> 512, k=10/5 conv as the whole model, [1, 512, 3199]: conv 0.74 -> 0.64 ms, its transpose 3.8 ms), as
  for any 2-D conv whose large output the graph wants in NCHW.

Why not a library pass: TVM 0.27 has none.  Its Relax transforms only convert conv1d's layout
(``ConvertLayout``'s ``InferLayoutConv1d``, to an NWC conv1d that still legalizes to TOPI's loop nest), and
the conv1d schedules of TOPI's x86 strategy went with Relay.

Only the CPU pipeline runs it (phase 2, before NHWC).  CUDA routes conv2d to cuDNN (``backends/cuda/cudnn.py``)
and would take 1-D convs the same way, but no GPU was at hand to measure cuDNN or DLight on H = 1 convs
against TVM's conv1d kernels, so its pipeline is unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .batchnorm import has_op

#: 1-D layouts the rewrite takes (data and output); kernels: any order of O, I, W
_DATA_LAYOUTS = ("NCW", "NWC")
#: pooling between 1-D convolutions, rewritten the same way (a 1 x k window), so the stack stays 4-D
_POOLS = ("relax.nn.max_pool1d", "relax.nn.avg_pool1d")
#: ops applied elementwise to their first argument (the others: attributes such as clip's bounds)
_UNARY = frozenset(f"relax.{op}" for op in (
    "nn.relu", "nn.gelu", "nn.gelu_tanh", "nn.silu", "nn.leakyrelu", "nn.softplus", "sigmoid", "tanh", "exp",
    "log", "sqrt", "rsqrt", "abs", "negative", "erf", "square", "clip", "astype", "floor", "ceil", "round",
    "sin", "cos"))
#: elementwise ops of two broadcast tensors
_BINARY = frozenset(f"relax.{op}" for op in (
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "power"))


def _eligible(attrs: Any) -> bool:
    out = str(attrs.out_layout) or str(attrs.data_layout)
    kernel = str(attrs.kernel_layout)
    return (str(attrs.data_layout) in _DATA_LAYOUTS and out in _DATA_LAYOUTS
            and len(kernel) == 3 and sorted(kernel) == ["I", "O", "W"])


def _with_height(layout: str) -> str:
    """A 1-D layout with H before W (``NCW`` -> ``NCHW``, ``OIW`` -> ``OIHW``, ``WIO`` -> ``HWIO``)."""
    return layout.replace("W", "HW")


def _ndim(expr: Any) -> int:
    """The rank of a tensor-typed expression, -1 otherwise (unknown rank, a tuple, a shape)."""
    return int(getattr(expr.ty, "ndim", -1)) if hasattr(expr.ty, "dtype") else -1


def _unsqueezed(relax: Any, operand: Any, rank: int, axis: int) -> Any | None:
    """``operand`` of an elementwise op whose other operand, of ``rank``, gains a unit axis at ``axis``:
    broadcasting aligns the trailing dims, so an operand that reaches past ``axis`` (a ``[1, C, 1]`` bias of
    an NCW tensor, a ``[C, 1]`` batch-norm scale) gains the same axis; a shorter one (``[L]``, a scalar) is
    unchanged.  None: no such operand (higher rank, not a tensor)."""
    import tvm

    r = _ndim(operand)
    if r < 0 or r > rank:
        return None
    if r <= rank - axis:
        return operand
    at = axis - (rank - r)
    if isinstance(operand, tvm.ir.expr.Constant):
        return relax.const(np.expand_dims(operand.value.numpy(), at))
    return relax.op.expand_dims(operand, [at])


def _as_conv2d(relax: Any, call: Any, tall: Any | None) -> tuple[Any, int]:
    """The conv2d of an eligible conv1d ``call`` and the output axis to squeeze; ``tall``: its input with the
    unit axis already there, if any (the previous conv1d's output)."""
    import tvm

    a = call.attrs
    x, w = call.args
    layout, kernel = str(a.data_layout), str(a.kernel_layout)
    out = str(a.out_layout) or layout
    if isinstance(w, tvm.ir.expr.Constant):  # a constant stays one: the packing legalizations read its values
        w2 = relax.const(np.expand_dims(w.value.numpy(), kernel.index("W")))
    else:
        w2 = relax.op.expand_dims(w, [kernel.index("W")])
    (s,), (d,), (lo, hi) = ([int(v) for v in a.strides], [int(v) for v in a.dilation],
                            [int(v) for v in a.padding])
    x2 = tall if tall is not None else relax.op.expand_dims(x, [layout.index("W")])
    y = relax.op.nn.conv2d(x2, w2, strides=[1, s],
                           padding=[0, lo, 0, hi], dilation=[1, d], groups=int(a.groups),
                           data_layout=_with_height(layout), kernel_layout=_with_height(kernel),
                           out_layout=_with_height(out), out_dtype=a.out_dtype)
    return y, out.index("W")


def _as_pool2d(relax: Any, call: Any, tall: Any | None) -> tuple[Any, int]:
    """The pool2d of a max/avg pool1d ``call`` (NCW or NWC) and the output axis to squeeze."""
    a = call.attrs
    layout = str(a.layout)
    out = str(a.out_layout) or layout
    (k,), (s,), (d,), (lo, hi) = ([int(v) for v in a.pool_size], [int(v) for v in a.strides],
                                  [int(v) for v in a.dilation], [int(v) for v in a.padding])
    x2 = tall if tall is not None else relax.op.expand_dims(call.args[0], [layout.index("W")])
    pool = relax.op.nn.max_pool2d if call.op.name == "relax.nn.max_pool1d" else relax.op.nn.avg_pool2d
    y = pool(x2, pool_size=[1, k], strides=[1, s], padding=[0, lo, 0, hi], dilation=[1, d],
             ceil_mode=bool(a.ceil_mode), count_include_pad=bool(a.count_include_pad),
             layout=_with_height(layout), out_layout=_with_height(out))
    return y, out.index("W")


def _mutator() -> Any:
    """The rewriting Relax mutator (built on first use: TVM's decorator needs TVM)."""
    import tvm
    from tvm import relax
    from tvm.ir import Op

    @relax.expr_functor.mutator
    class Conv1dAsConv2d(relax.PyExprMutator):
        """conv1d -> conv2d + squeeze; squeezes of those sunk past elementwise ops, cancelled by expand_dims."""

        def __init__(self, mod: Any) -> None:
            super().__init__(mod)
            self.tall: list[Any] = []  # the 4-D variables this rewrite made, whose squeezes it may move

        def _squeezed(self, expr: Any) -> tuple[Any, int] | None:
            """(the 4-D variable, the axis) when ``expr`` is a squeeze of one of :attr:`tall`."""
            bound = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
            if not (isinstance(bound, relax.Call) and isinstance(bound.op, Op) and bound.op.name == "relax.squeeze"
                    and bound.attrs.axis is not None and len(bound.attrs.axis) == 1):
                return None
            source = bound.args[0]
            if not any(source.same_as(v) for v in self.tall):
                return None
            return source, int(bound.attrs.axis[0])

        def _input(self, call: Any, layout: str) -> Any | None:
            """The 4-D form of a conv1d's or pool1d's input when it is a squeeze at the axis it would expand."""
            sq = self._squeezed(call.args[0])
            return sq[0] if sq is not None and sq[1] == layout.index("W") else None

        def _tall(self, value: Any, axis: int) -> Any:
            """``squeeze(value, axis)``, ``value`` bound to a variable of :attr:`tall`."""
            var = self.builder_.emit(value)
            self.tall.append(var)
            return relax.op.squeeze(var, [axis])

        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            if not isinstance(call.op, Op):
                return call
            name = call.op.name
            if name == "relax.nn.conv1d" and _eligible(call.attrs):
                return self._tall(*_as_conv2d(relax, call, self._input(call, str(call.attrs.data_layout))))
            if name in _POOLS and str(call.attrs.layout) in _DATA_LAYOUTS and (
                    str(call.attrs.out_layout) or str(call.attrs.layout)) in _DATA_LAYOUTS:
                return self._tall(*_as_pool2d(relax, call, self._input(call, str(call.attrs.layout))))
            if name in _UNARY and call.args and (sq := self._squeezed(call.args[0])) is not None:
                return self._tall(relax.Call(call.op, [sq[0], *call.args[1:]], call.attrs, call.ty_args), sq[1])
            if name == "relax.nn.prelu" and (sq := self._squeezed(call.args[0])) is not None:
                return self._prelu(call, *sq)
            if name in _BINARY and len(call.args) == 2:
                return self._binary(call)
            if name == "relax.expand_dims" and (sq := self._squeezed(call.args[0])) is not None:
                if [int(a) for a in call.attrs.axis] == [sq[1]]:
                    return sq[0]  # the next conv1d's input: the squeeze undone
            if name == "relax.reshape" and (sq := self._squeezed(call.args[0])) is not None:
                return relax.op.reshape(sq[0], call.args[1])
            return call

        def _prelu(self, call: Any, tall: Any, axis: int) -> Any:
            channel = int(call.attrs.axis)
            channel = channel + 1 if channel >= axis else channel
            return self._tall(relax.op.nn.prelu(tall, call.args[1], channel), axis)

        def _binary(self, call: Any) -> Any:
            lhs, rhs = call.args
            sl, sr = self._squeezed(lhs), self._squeezed(rhs)
            if sl is None and sr is None:
                return call
            tall, axis = sl or sr
            rank = _ndim(tall) - 1  # the squeezed operand's; an operand of a higher rank is left alone
            args = []
            for arg, sq in ((lhs, sl), (rhs, sr)):
                if sq is not None and sq[1] == axis:
                    args.append(sq[0])
                    continue
                arg = _unsqueezed(relax, arg, rank, axis)
                if arg is None:
                    return call
                args.append(arg)
            return self._tall(relax.Call(call.op, args, call.attrs, call.ty_args), axis)

    return Conv1dAsConv2d


def conv1d_as_conv2d(mod: Any) -> Any:
    """Rewrite every eligible ``relax.nn.conv1d`` of ``mod`` (see the module docstring)."""
    import tvm
    from tvm import relax

    if not has_op(mod, "relax.nn.conv1d"):
        return mod
    mutator = _mutator()(mod)
    # the squeezes that sank past their readers are left unused
    functions = {gv: relax.analysis.remove_all_unused(mutator.visit_expr(func))
                 if isinstance(func, relax.Function) else func for gv, func in mod.functions.items()}
    return tvm.IRModule(functions, attrs=mod.attrs)


def conv1d_as_conv2d_pass() -> Any:
    """:func:`conv1d_as_conv2d` as a module pass."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="forgekit.Conv1dAsConv2d")
    def rewrite(mod: Any, _ctx: Any) -> Any:
        return conv1d_as_conv2d(mod)

    return rewrite
