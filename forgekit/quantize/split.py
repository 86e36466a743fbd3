"""``split_tensors``: split large conv2d weights in two along the output channels (Forge's option for
accelerators and memory-constrained targets with a per-tensor size limit).

``conv2d(x, W)`` with ``W.size >= min_elements`` becomes ``concat([conv2d(x, W[:k]), conv2d(x, W[k:])],
axis=1)``: the same result, two weight tensors of half the size.
"""

from __future__ import annotations

from typing import Any

#: weights with at least this many elements are split (1 Mi elements = 4 MiB in fp32)
MIN_ELEMENTS = 1 << 20


def split_tensors(mod: Any, min_elements: int = MIN_ELEMENTS) -> Any:
    """``mod`` with every NCHW/OIHW conv2d whose constant weight has ``>= min_elements`` split in two."""
    import tvm
    from tvm import relax

    from . import graph

    @relax.expr_functor.mutator
    class Splitter(relax.PyExprMutator):
        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            if not (graph.is_quantizable(call) and call.op.name == "relax.nn.conv2d"):
                return call
            w = call.args[1].value.numpy()
            if w.size < min_elements or w.shape[0] < 2 or int(call.attrs.groups) != 1:
                return call
            half = w.shape[0] // 2
            a = call.attrs
            parts = [relax.op.nn.conv2d(call.args[0], relax.const(part), strides=a.strides, padding=a.padding,
                                        dilation=a.dilation, groups=a.groups, out_dtype=a.out_dtype)
                     for part in (w[:half].copy(), w[half:].copy())]
            return relax.op.concat([self.builder_.emit(p) for p in parts], axis=1)

    func = Splitter(mod).visit_expr(mod["main"])
    out = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs)
    out["main"] = func
    return relax.transform.Normalize()(out)
