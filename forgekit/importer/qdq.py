"""QDQ graphs (``QuantizeLinear -> DequantizeLinear -> Conv/MatMul``, as onnxruntime's
``quantize_static`` writes them) onto the integer path.

TVM imports a QDQ conv as quantize -> dequantize -> *float* conv (the dequantized weight folds into a
float constant), so the int8 model runs slower than fp32.  :func:`fuse_qdq` rewrites, at the ONNX
level before import::

    Conv(DequantizeLinear(xq, sx, zx), DequantizeLinear(Wq, sw, 0), b)
      -> Cast(ConvInteger(xq, Wq, zx), float) * (sx * sw) + b
    MatMul(DequantizeLinear(aq, sa, za), DequantizeLinear(Bq, sb, 0))
      -> Cast(MatMulInteger(aq, Bq, za), float) * (sa * sb)

which is the same arithmetic (int32 accumulation is exact) and lands on the integer conv/matmul
converters of :mod:`.converters.quant` and from there on the VNNI kernels.  Only constant weights with a
zero weight zero point and scalar activation scale/zero point are fused; everything else is left as is.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


def _const(graph: onnx.GraphProto, name: str) -> np.ndarray | None:
    for init in graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    return None


def fuse_qdq(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every fusable DequantizeLinear -> Conv/MatMul pair on integer operators."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, int] = {}
    for n in graph.node:
        for i in n.input:
            consumers[i] = consumers.get(i, 0) + 1
    new_nodes: list[onnx.NodeProto] = []
    new_inits: list[onnx.TensorProto] = []
    changed = False

    def dq_parts(name: str) -> tuple[onnx.NodeProto, np.ndarray, np.ndarray] | None:
        node = producer.get(name)
        if node is None or node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx"):
            return None
        scale = _const(graph, node.input[1])
        zp = _const(graph, node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if scale is None or (len(node.input) > 2 and node.input[2] and zp is None):
            return None
        return node, scale.astype(np.float32), zp

    for node in graph.node:
        if node.op_type not in ("Conv", "MatMul") or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            new_nodes.append(node)
            continue
        x, w = dq_parts(node.input[0]), dq_parts(node.input[1])
        wq = _const(graph, w[0].input[0]) if w is not None else None
        ok = (x is not None and w is not None and wq is not None and x[1].size == 1
              and (x[2] is None or x[2].size == 1) and (w[2] is None or not np.any(w[2]))
              and wq.dtype in (np.int8, np.uint8))
        if ok:
            axis = next((a.i for a in w[0].attribute if a.name == "axis"), 1)
            channels = wq.shape[0] if node.op_type == "Conv" else wq.shape[-1]
            want_axis = 0 if node.op_type == "Conv" else wq.ndim - 1
            ok = w[1].size == 1 or (w[1].size == channels and axis % wq.ndim == want_axis)
            if node.op_type == "MatMul" and wq.ndim != 2:
                ok = False
        if not ok:
            new_nodes.append(node)
            continue
        changed = True
        base = node.name or node.output[0]
        xq = x[0].input[0]
        zx = x[0].input[2] if len(x[0].input) > 2 and x[0].input[2] else ""
        acc, accf = f"{base}__acc", f"{base}__accf"
        scale = (x[1].reshape(()) * w[1].reshape(-1)).astype(np.float32)
        # per output channel along axis 1 of the conv output, whatever its rank (the weight's: [N, C, L] of a
        # 1-D conv, [N, C, D, H, W] of a 3-D one); a fixed [1, -1, 1, 1] broadcast a 1-D conv's [N, C, L] to 4-D
        channel_shape = [1, -1] + [1] * (wq.ndim - 2)
        if node.op_type == "Conv":
            scale = scale.reshape(channel_shape) if scale.size > 1 else scale.reshape(())
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            new_nodes.append(helper.make_node("ConvInteger", [xq, w[0].input[0], zx], [acc], name=f"{base}__int",
                                              **attrs))
        else:
            new_nodes.append(helper.make_node("MatMulInteger", [xq, w[0].input[0], zx], [acc], name=f"{base}__int"))
        new_nodes.append(helper.make_node("Cast", [acc], [accf], to=onnx.TensorProto.FLOAT, name=f"{base}__cast"))
        new_inits.append(numpy_helper.from_array(scale, f"{base}__scale"))
        has_bias = node.op_type == "Conv" and len(node.input) > 2 and node.input[2]
        scaled = f"{base}__scaled" if has_bias else node.output[0]
        new_nodes.append(helper.make_node("Mul", [accf, f"{base}__scale"], [scaled], name=f"{base}__dequant"))
        if has_bias:
            new_inits.append(numpy_helper.from_array(np.array(channel_shape, np.int64), f"{base}__bshape"))
            new_nodes.append(helper.make_node("Reshape", [node.input[2], f"{base}__bshape"], [f"{base}__b4"],
                                              name=f"{base}__bias_shape"))
            new_nodes.append(helper.make_node("Add", [scaled, f"{base}__b4"], [node.output[0]], name=f"{base}__bias"))
    if not changed:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(new_nodes)
    out.graph.initializer.extend(new_inits)
    # DequantizeLinear nodes whose only consumers were fused are now dead; the importer's folding and
    # Relax's dead-code elimination drop them (and their float weight copies) later.
    return out
