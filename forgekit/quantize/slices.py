"""``split`` -> one ``strided_slice`` per used part, in the quantized graph.

A split returns a tuple, and a kernel that produces a tuple does not fuse with what follows: in YOLOv8's
C2f (``y0, y1 = split(cv1(x))``; ``y1`` feeds a bottleneck, ``concat(y0, y1, ...)`` the next conv) the
split is its own kernel that copies the fp32 halves, then the requantize of the bottleneck's input and
the ``concat`` + requantize of the next conv each read them again.  A ``strided_slice`` per part is an
injective op on the unsplit tensor, so FuseOps folds it into those requantize/concat kernels and the
copy disappears; a concat of the parts in order reads the tensor itself.  A part that also feeds a
conv epilogue (a residual add) is still materialized once: FuseOps does not fuse producers into a conv.
Measured on bench/models/yolo_style.onnx (320, int8, 2 threads): the split kernels took 0.31 of 7.8 ms
profiled; same-process A/B with and without: 9.96 vs 10.09 ms (p25 of 300 runs, loaded machine), -1.5%.
"""

from __future__ import annotations

from typing import Any


def split_to_slices(mod: Any) -> Any:
    """``mod`` with every ``split(t)[i]`` of a statically shaped ``t`` read as ``strided_slice(t)``."""
    import tvm
    from tvm import relax

    @relax.expr_functor.mutator
    class Slicer(relax.PyExprMutator):
        def __init__(self, mod: Any) -> None:
            super().__init__(mod)
            self.parts: dict[Any, tuple[Any, int, int, int]] = {}  # split(t)[i] var -> (t, axis, begin, end)

        def visit_var_binding_(self, binding: Any) -> None:
            super().visit_var_binding_(binding)
            part = self._part(binding.value)
            # only parts used inside their dataflow block: a part that leaves it (a function output) is read
            # where the split's input, a dataflow var, is not defined (fuzz asset quant_zero_row_pad_matmul_split)
            if part is not None and isinstance(binding.var, relax.DataflowVar):
                self.parts[binding.var] = part

        def visit_var_(self, var: Any) -> Any:
            # a slice at every use, not one bound slice shared by the uses: a shared one would be a
            # kernel of its own (a tensor with two consumers is materialized), like the split it replaces
            if var in self.parts:
                data, axis, begin, end = self.parts[var]
                return relax.op.strided_slice(self.visit_expr(data), axes=[axis], begin=[begin], end=[end])
            return super().visit_var_(var)

        def visit_dataflow_var_(self, var: Any) -> Any:
            if var in self.parts:
                return self.visit_var_(var)
            return super().visit_dataflow_var_(var)

        def visit_call_(self, call: Any) -> Any:
            if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.concat"
                    and isinstance(call.args[0], relax.Tuple) and call.attrs.axis is not None):
                return super().visit_call_(call)
            # consecutive parts of one split, concatenated in order along the split axis, are one slice of
            # the tensor (C2f: concat(y0, y1, ...) is concat(t, ...)): no slice, and nothing for CSE to
            # merge with the slice another consumer reads (a merged slice is a kernel of its own)
            axis_c = int(call.attrs.axis) % len(call.ty.shape.values)
            fields: list[Any] = []
            runs: list[tuple[Any, int, int, int] | None] = []
            for f in call.args[0].fields:
                part = self.parts.get(f) if isinstance(f, relax.Var) else None
                last = runs[-1] if runs else None
                if (part is not None and last is not None and last[0].same_as(part[0]) and last[1] == part[1] == axis_c
                        and last[3] == part[2]):
                    runs[-1] = (last[0], last[1], last[2], part[3])
                    continue
                runs.append(part)
                fields.append(f)
            if len(runs) == len(call.args[0].fields):
                return super().visit_call_(call)
            new = []
            for f, run in zip(fields, runs):
                if run is None:
                    new.append(self.visit_expr(f))
                    continue
                data, axis, begin, end = run
                data = self.visit_expr(data)
                whole = begin == 0 and end == int(data.ty.shape.values[axis])
                new.append(data if whole else relax.op.strided_slice(data, axes=[axis], begin=[begin], end=[end]))
            return relax.op.concat(new, axis=int(call.attrs.axis)) if len(new) > 1 else new[0]

        def _part(self, value: Any) -> tuple[Any, int, int, int] | None:
            if not isinstance(value, relax.TupleGetItem) or not isinstance(value.tuple_value, relax.Var):
                return None
            split = self.lookup_binding(self.visit_expr(value.tuple_value))
            if not (isinstance(split, relax.Call) and isinstance(split.op, tvm.ir.Op) and split.op.name == "relax.split"):
                return None
            shape = getattr(split.args[0].ty, "shape", None)
            if shape is None or not all(isinstance(d, tvm.tirx.IntImm) for d in shape.values):
                return None
            axis = int(split.attrs.axis) % len(shape.values)
            try:
                sizes = [int(f.shape.values[axis]) for f in split.ty.fields]
            except (AttributeError, TypeError):  # a symbolic part
                return None
            begin = sum(sizes[:value.index])
            return split.args[0], axis, begin, begin + sizes[value.index]

    func = Slicer(mod).visit_expr(mod["main"])
    out = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs)
    out["main"] = func
    return relax.transform.DeadCodeElimination()(relax.transform.Normalize()(out))
