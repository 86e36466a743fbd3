"""A per-tensor ``quantize`` and a constant ``pad`` keep the channel layout of their input (NHWC) instead of
going back to NCHW.

TVM 0.27 gives ``relax.quantize`` no layout rule, so ConvertLayout puts it back in NCHW between two transposes:
``permute_dims(x_nhwc) -> quantize -> permute_dims -> conv2d (NHWC)``, and the int8 conv's input made a round
trip through NCHW.  onnxruntime's ``quantize_dynamic`` on a CNN quantizes every conv's input at run time
(``DynamicQuantizeLinear``): on ddddocr's CAPTCHA recognizer those transposes and NCHW quantizations took
0.9 of 7.9 ms.  With a scalar scale and zero point, quantization is elementwise, so it commutes with any
transpose:

    quantize(permute_dims(x, p)) == permute_dims(quantize(x), p)

and the transpose that follows then cancels against it (``permute_dims(permute_dims(y, p), q)`` is
``permute_dims(y, p[q])``, the identity here).

Why not a layout rule for ``relax.quantize`` (as :func:`forgekit.passes.layout.complete_layout_rules` gives
unary ops): the registry is per op, and a per-channel quantize (a vector scale on ``axis=1``) needs its axis
moved, which relu's rule does not do.  This rewrite takes the per-tensor ones only.

A constant ``pad`` (TVM 0.27 has no layout rule for it either) commutes with a transpose once its widths are
permuted the same way.  Pads come from ONNX Pad (:mod:`forgekit.importer.converters.pad`; a zero one before
a conv has become the conv's padding by then) and from asymmetric uint8 quantization, whose padded convs read
the zero point at the border (:mod:`forgekit.quantize.rewrite`): each such conv's input went NHWC -> NCHW ->
pad -> NHWC, three passes where one is needed.
"""

from __future__ import annotations

from typing import Any

from .functions import rewrite_functions


def static_elements(expr: Any) -> int | None:
    """How many elements ``expr`` (a Relax tensor) has, or None when a dimension is symbolic or unknown."""
    values = getattr(getattr(getattr(expr, "ty", None), "shape", None), "values", None)
    if values is None:
        return None
    total = 1
    for dim in values:
        if not hasattr(dim, "value"):
            return None
        total *= int(dim.value)
    return total


def quantize_keeps_layout_pass() -> Any:
    """The module pass (see the module docstring)."""
    import tvm
    from tvm import relax

    permute, quantize = tvm.ir.Op.get("relax.permute_dims"), tvm.ir.Op.get("relax.quantize")
    pad = tvm.ir.Op.get("relax.nn.pad")

    def axes_of(call: Any, rank: int) -> list[int]:
        axes = call.attrs.axes
        return list(range(rank))[::-1] if axes is None else [int(a) for a in axes]

    @relax.expr_functor.mutator
    class Sink(relax.PyExprMutator):
        def __init__(self, mod: Any) -> None:
            super().__init__(mod)
            self.permuted: dict[Any, tuple[Any, list[int]]] = {}  # var -> (its input, axes)

        def visit_var_binding_(self, binding: Any) -> None:
            value = self.visit_expr(binding.value)
            # a dataflow block's outputs keep their bindings: a var used after the block is not re-pointed
            if isinstance(binding.var, relax.DataflowVar) and isinstance(value, relax.Call):
                if value.op == permute:
                    self._permute(binding, value)
                    return
                if (value.op == quantize and value.args[0] in self.permuted
                        and all(static_elements(a) == 1 for a in value.args[1:3])):
                    source, axes = self.permuted[value.args[0]]
                    inner = self.builder_.emit(relax.Call(quantize, [source, *value.args[1:]], value.attrs))
                    self._permute(binding, relax.op.permute_dims(inner, axes))
                    return
                if value.op == pad and value.args[0] in self.permuted and value.attrs.pad_mode == "constant":
                    source, axes = self.permuted[value.args[0]]
                    widths = [int(w) for w in value.attrs.pad_width]
                    moved = [0] * len(widths)
                    for i, a in enumerate(axes):  # axis i of the pad's input is axis a of the source
                        moved[2 * a:2 * a + 2] = widths[2 * i:2 * i + 2]
                    inner = self.builder_.emit(relax.op.nn.pad(source, moved, pad_value=float(value.attrs.pad_value)))
                    self._permute(binding, relax.op.permute_dims(inner, axes))
                    return
            super().visit_var_binding_(binding)

        def _permute(self, binding: Any, call: Any) -> None:
            data = call.args[0]
            axes = axes_of(call, int(data.ty.ndim))
            if data in self.permuted:  # a transpose of a transpose: one transpose, or none
                source, first = self.permuted[data]
                data, axes = source, [first[a] for a in axes]
            if axes == list(range(len(axes))):
                self.set_var_remap(binding.var, data)
                return
            out = self.builder_.emit(relax.op.permute_dims(data, axes), name_hint=binding.var.name)
            self.permuted[out] = (data, axes)
            self.set_var_remap(binding.var, out)

    @tvm.transform.module_pass(opt_level=0, name="forgekit.QuantizeKeepsLayout")
    def sink(mod: Any, _ctx: Any) -> Any:
        return rewrite_functions(Sink(mod), mod)

    return sink
