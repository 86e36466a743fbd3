"""A partition (a Relax function of single operators) as a standalone ONNX model.

TensorRT (``trtexec --onnx``), onnxruntime and TI's import all take ONNX, so an offloaded region leaves
forgekit as an ONNX subgraph.  TVM 0.27 has an ONNX importer but no exporter, and the partitions hold only
the operators of TensorRT's single-op patterns, so this covers exactly those (:data:`EXPORTABLE`); the
partitioner (:mod:`.tensorrt`) uses only the patterns whose operator is here, so every partition it makes
exports.  Each exported subgraph is checked against TVM's own result for the same function
(:func:`forgekit.offload.tensorrt.check_subgraphs`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import NotAvailableError
from .partition import flat_ops, op_name, shapes_of

OPSET = 18

_UNARY = {"nn.relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "exp": "Exp", "log": "Log", "sqrt": "Sqrt",
          "abs": "Abs", "negative": "Neg", "sin": "Sin", "cos": "Cos", "atan": "Atan", "ceil": "Ceil",
          "floor": "Floor", "erf": "Erf"}
_BINARY = {"add": "Add", "subtract": "Sub", "multiply": "Mul", "divide": "Div", "power": "Pow", "maximum": "Max",
           "minimum": "Min"}
_REDUCE = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin", "prod": "ReduceProd"}
_OTHER = {"nn.conv1d", "nn.conv2d", "matmul", "nn.softmax", "permute_dims", "reshape", "expand_dims", "squeeze",
          "nn.max_pool2d", "nn.avg_pool2d", "nn.adaptive_avg_pool2d", "concat", "split", "clip", "nn.layer_norm",
          "strided_slice", "nn.batch_flatten", "nn.silu"}
#: Relax operators (without the ``relax.`` prefix) this module writes as ONNX
EXPORTABLE = frozenset(_UNARY) | frozenset(_BINARY) | frozenset(_REDUCE) | _OTHER


def _ints(values: Any) -> list[int]:
    return [int(v) for v in values]


class _Writer:
    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.names: dict[Any, Any] = {}
        self.used: set[str] = set()

    def fresh(self, hint: str) -> str:
        name, i = hint or "t", 0
        while name in self.used:
            i += 1
            name = f"{hint}_{i}"
        self.used.add(name)
        return name

    def const(self, array: np.ndarray, hint: str) -> str:
        from onnx import numpy_helper

        name = self.fresh(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def ref(self, expr: Any) -> Any:
        """The ONNX name (a list of names for a tuple) an argument expression has."""
        from tvm import relax
        from tvm.ir.expr import Constant

        if isinstance(expr, relax.Var):
            return self.names[expr]
        if isinstance(expr, Constant):
            value = expr.value
            return self.const(value.numpy() if hasattr(value, "numpy") else np.asarray(value), "const")
        if isinstance(expr, relax.ShapeExpr):
            return self.const(np.array(_ints(expr.values), np.int64), "shape")
        if isinstance(expr, relax.Tuple):
            return [self.ref(f) for f in expr.fields]
        if isinstance(expr, relax.TupleGetItem):
            return self.ref(expr.tuple_value)[expr.index]
        raise NotAvailableError(f"forgekit cannot write {type(expr).__name__} as an ONNX value.")

    def node(self, op_type: str, inputs: list[str], out: str, **attrs: Any) -> str:
        from onnx import helper

        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out


def _scalar(prim: Any) -> float:
    return float(prim.value.value if hasattr(prim.value, "value") else prim.value)


def _tuple_ints(expr: Any) -> list[int]:
    """Integers of a Relax tuple of PrimValues or a ShapeExpr (strided_slice's axes/begin/end/strides)."""
    from tvm import relax

    if isinstance(expr, relax.ShapeExpr):
        return _ints(expr.values)
    if isinstance(expr, relax.Tuple):
        return [int(f.value.value if hasattr(f.value, "value") else f.value) for f in expr.fields]
    raise NotAvailableError("strided_slice with run-time bounds has no static ONNX Slice here.")


def _emit(w: _Writer, call: Any, out: str) -> Any:  # noqa: C901 - one branch per operator, kept flat on purpose
    name = op_name(call)
    args, attrs = list(call.args), call.attrs
    x = w.ref(args[0]) if args else None
    if name in _UNARY:
        return w.node(_UNARY[name], [x], out)
    if name in _BINARY:
        return w.node(_BINARY[name], [x, w.ref(args[1])], out)
    if name in ("nn.conv1d", "nn.conv2d"):
        if str(attrs.data_layout) not in ("NCW", "NCHW") or str(attrs.kernel_layout) not in ("OIW", "OIHW"):
            raise NotAvailableError(f"{name} in layout {attrs.data_layout}/{attrs.kernel_layout}: ONNX Conv is NCHW/OIHW.")
        return w.node("Conv", [x, w.ref(args[1])], out, strides=_ints(attrs.strides), pads=_ints(attrs.padding),
                      dilations=_ints(attrs.dilation), group=int(attrs.groups))
    if name == "matmul":
        return w.node("MatMul", [x, w.ref(args[1])], out)
    if name == "nn.softmax":
        return w.node("Softmax", [x], out, axis=int(attrs.axis))
    if name == "permute_dims":
        rank = len(shapes_of(args[0].ty)[0][0])
        perm = _ints(attrs.axes) if attrs.axes is not None else list(reversed(range(rank)))
        return w.node("Transpose", [x], out, perm=perm)
    if name == "reshape":
        return w.node("Reshape", [x, w.ref(args[1])], out)
    if name == "expand_dims":
        return w.node("Unsqueeze", [x, w.const(np.array(_ints(attrs.axis), np.int64), "axes")], out)
    if name == "squeeze":
        axes = [] if attrs.axis is None else [w.const(np.array(_ints(attrs.axis), np.int64), "axes")]
        return w.node("Squeeze", [x, *axes], out)
    if name in ("nn.max_pool2d", "nn.avg_pool2d"):
        if str(attrs.layout) != "NCHW":
            raise NotAvailableError(f"{name} in layout {attrs.layout}: ONNX pools are NCHW.")
        common = {"kernel_shape": _ints(attrs.pool_size), "strides": _ints(attrs.strides),
                  "pads": _ints(attrs.padding), "ceil_mode": int(bool(attrs.ceil_mode))}
        if name == "nn.max_pool2d":
            return w.node("MaxPool", [x], out, dilations=_ints(attrs.dilation), **common)
        if any(d != 1 for d in _ints(attrs.dilation)):
            raise NotAvailableError("avg_pool2d with dilation needs ONNX opset 19.")
        return w.node("AveragePool", [x], out, count_include_pad=int(bool(attrs.count_include_pad)), **common)
    if name == "nn.adaptive_avg_pool2d":
        if attrs.output_size is not None and _ints(attrs.output_size) != [1, 1] or str(attrs.layout) != "NCHW":
            raise NotAvailableError("adaptive_avg_pool2d other than a global NCHW average has no ONNX operator.")
        return w.node("GlobalAveragePool", [x], out)
    if name in _REDUCE:
        axes = [] if attrs.axis is None else [w.const(np.array(_ints(attrs.axis), np.int64), "axes")]
        return w.node(_REDUCE[name], [x, *axes], out, keepdims=int(bool(attrs.keepdims)))
    if name == "concat":
        return w.node("Concat", list(x), out, axis=int(attrs.axis))
    if name == "split":
        from onnx import helper

        count = len(shapes_of(call.ty))
        outs = [w.fresh(f"{out}_{i}") for i in range(count)]
        sections = attrs.indices_or_sections
        extra: list[str] = []
        if not isinstance(sections, int) and not hasattr(sections, "value"):
            dim = shapes_of(args[0].ty)[0][0][int(attrs.axis)]
            bounds = [0, *_ints(sections), dim]
            extra = [w.const(np.diff(bounds).astype(np.int64), "split")]
        kw = {} if extra else {"num_outputs": count}
        w.nodes.append(helper.make_node("Split", [x, *extra], outs, name=out, axis=int(attrs.axis), **kw))
        return outs
    if name == "clip":
        dtype = np.dtype(shapes_of(args[0].ty)[0][1])
        lo, hi = (w.const(np.array(_scalar(a), dtype), "clip") for a in args[1:3])
        return w.node("Clip", [x, lo, hi], out)
    if name == "nn.layer_norm":
        rank = len(shapes_of(args[0].ty)[0][0])
        axes = sorted(a % rank for a in _ints(attrs.axes))
        if axes != list(range(axes[0], rank)) or not (attrs.center and attrs.scale):
            raise NotAvailableError("layer_norm over non-trailing axes has no ONNX LayerNormalization.")
        return w.node("LayerNormalization", [x, w.ref(args[1]), w.ref(args[2])], out, axis=axes[0],
                      epsilon=float(attrs.epsilon))
    if name == "strided_slice":
        axes, begin, end = (_tuple_ints(a) for a in args[1:4])
        steps = _tuple_ints(args[4]) if len(args) > 4 else [1] * len(axes)
        consts = [w.const(np.array(v, np.int64), n) for v, n in ((begin, "starts"), (end, "ends"), (axes, "axes"),
                                                                 (steps, "steps"))]
        return w.node("Slice", [x, *consts], out)
    if name == "nn.batch_flatten":
        return w.node("Flatten", [x], out, axis=1)
    if name == "nn.silu":
        sig = w.node("Sigmoid", [x], w.fresh(f"{out}_sigmoid"))
        return w.node("Mul", [x, sig], out)
    raise NotAvailableError(f"forgekit has no ONNX export for Relax operator '{name}'.")


def _value_info(name: str, shape: tuple[int, ...], dtype: str) -> Any:
    from onnx import helper

    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), list(shape))


def export_partition(func: Any, name: str = "subgraph") -> Any:
    """``func`` (a partition, or any Relax function of :data:`EXPORTABLE` operators) as an ONNX ModelProto."""
    import onnx
    from onnx import helper
    from tvm import relax

    params, ops, result = flat_ops(func)
    w = _Writer()
    inputs = []
    for p in params:
        (shape, dtype), = shapes_of(p.ty)
        w.names[p] = w.fresh(str(p.name))
        inputs.append(_value_info(w.names[p], shape, dtype))
    results = list(result.fields) if isinstance(result, relax.Tuple) else [result]
    out_names = [f"output_{i}" for i in range(len(results))] if len(results) > 1 else ["output"]
    for var, expr in ops:
        if isinstance(expr, relax.TupleGetItem):
            w.names[var] = w.ref(expr)
            continue
        w.names[var] = _emit(w, expr, w.fresh(str(var.name)))
    for expr, out in zip(results, out_names):
        w.used.add(out)
        if isinstance(expr, relax.Call):
            _emit(w, expr, out)
        else:  # a variable, tuple item or constant returned as it is
            w.node("Identity", [w.ref(expr)], out)
    outputs = [_value_info(o, *shapes_of(e.ty)[0]) for o, e in zip(out_names, results)]
    graph = helper.make_graph(w.nodes, name, inputs, outputs, initializer=w.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="forgekit")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model
