"""Convolutions routed to cuDNN on CUDA targets (forgekit/backends/cuda/cudnn.py): which chains become one
``forgekit_cudnn_conv2d`` call, with which attributes, and that the rewritten graph computes what onnxruntime
does.  No GPU here: the rewritten module is built for the CPU, with ``forgekit_cudnn_conv2d`` registered as a
numpy implementation of the call's documented contract (ext/forgekit_cudnn.cc's header), so a wrong pad,
stride, group count, layout, bias, residual or relu in the rewrite shows up as a wrong output.  The C++ side
is compiled and linked in test_cudnn_extension.py and run on a GPU by bench/gpu_run.py."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import ort_run

tvm = pytest.importorskip("tvm")


def _reference_conv(args: list) -> None:
    """y = relu?(conv(x, w) + bias + residual), fp32 accumulation, rounded once (the extension's contract)."""
    *inputs, attrs, y = args
    a = [int(v) for v in attrs]
    nhwc, ph, pw, sh, sw, dh, dw, groups, has_bias, has_res, relu = a[:11]
    x, w = inputs[0].numpy().astype(np.float32), inputs[1].numpy().astype(np.float32)
    if nhwc:
        x, w = x.transpose(0, 3, 1, 2), w.transpose(0, 3, 1, 2)  # NHWC/OHWI -> NCHW/OIHW
    n, c, _, _ = x.shape
    k, cg, r, s = w.shape
    x = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh, ow = (x.shape[2] - dh * (r - 1) - 1) // sh + 1, (x.shape[3] - dw * (s - 1) - 1) // sw + 1
    out = np.zeros((n, k, oh, ow), np.float32)
    kg = k // groups
    for g in range(groups):
        xg = x[:, g * cg:(g + 1) * cg]
        for i in range(r):
            for j in range(s):
                patch = xg[:, :, i * dh:i * dh + sh * oh:sh, j * dw:j * dw + sw * ow:sw]
                out[:, g * kg:(g + 1) * kg] += np.einsum("nchw,kc->nkhw", patch, w[g * kg:(g + 1) * kg, :, i, j])
    if nhwc:
        out = out.transpose(0, 2, 3, 1)
    rest = inputs[2:]
    if has_bias:
        b = rest.pop(0).numpy().astype(np.float32)
        out = out + (b if nhwc else b.reshape(1, -1, 1, 1))
    if has_res:
        out = out + rest.pop(0).numpy().astype(np.float32)
    if relu:
        out = np.maximum(out, 0)
    y.copyfrom(out.astype(y.dtype if isinstance(y.dtype, str) else str(y.dtype)))


@pytest.fixture(scope="module", autouse=True)
def numpy_cudnn():
    import tvm_ffi

    from forgekit.backends.cuda.cudnn import FUNCTION

    tvm_ffi.register_global_func(FUNCTION, lambda *args: _reference_conv(list(args)), override=True)


def _model(batch: int | str = 2) -> object:
    """Every chain the rewrite covers and some it must not: conv+bias+relu, a residual block, depthwise with
    ReLU6 (Clip), stride 2 with dilation, a bias-free conv, and an asymmetric pad (TVM's kernel stays)."""
    rng = np.random.default_rng(0)
    inits, nodes = [], []

    def conv(name, x, cin, cout, k, group=1, bias=True, **attrs):
        w = (rng.standard_normal((cout, cin // group, k, k)) / np.sqrt(cin // group * k * k)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"{name}_w"))
        ins = [x, f"{name}_w"]
        if bias:
            inits.append(numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32) * 0.1, f"{name}_b"))
            ins.append(f"{name}_b")
        nodes.append(helper.make_node("Conv", ins, [name], group=group, **attrs))
        return name

    c1 = conv("c1", "x", 3, 16, 3, pads=[1, 1, 1, 1])
    nodes.append(helper.make_node("Relu", [c1], ["r1"]))
    c2 = conv("c2", "r1", 16, 16, 3, pads=[1, 1, 1, 1])
    nodes.append(helper.make_node("Add", [c2, "r1"], ["a2"]))
    nodes.append(helper.make_node("Relu", ["a2"], ["r2"]))
    c3 = conv("c3", "r2", 16, 16, 3, group=16, pads=[1, 1, 1, 1])
    inits += [numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]
    nodes.append(helper.make_node("Clip", [c3, "lo", "hi"], ["r3"]))
    c4 = conv("c4", "r3", 16, 24, 3, strides=[2, 2], dilations=[2, 2], pads=[2, 2, 2, 2])
    c5 = conv("c5", c4, 24, 24, 1, bias=False)
    c6 = conv("c6", c5, 24, 8, 2, pads=[0, 0, 1, 1])  # asymmetric
    graph = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 20, 20])],
                              [helper.make_tensor_value_info(c6, TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _routed(model, precision: str, layout: str | None):
    from forgekit.backends.cuda.cudnn import route_convolutions
    from forgekit.model.facade import from_onnx
    from forgekit.passes import graph_passes

    mod = tvm.transform.Sequential(graph_passes(3, precision=precision, layout=layout))(from_onnx(model).mod)
    return route_convolutions(mod, tensor_ops=False)


def _calls(mod) -> list[list[int]]:
    """The attrs of every forgekit_cudnn_conv2d call in ``main``, in order."""
    from tvm import relax

    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.args[0], relax.ExternFunc):
            found.append([int(v) for v in expr.args[1].fields[-1].values])

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


def _run(mod, feeds: list[np.ndarray]) -> np.ndarray:
    from tvm import relax

    exe = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(exe, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(f) for f in feeds]).numpy()


@pytest.mark.parametrize("precision,layout", [("float32", None), ("float16", None), ("float32", "last"),
                                              ("float16", "last")])
def test_conv_chains_become_one_cudnn_call_each_and_match_onnxruntime(precision, layout):
    model = _model()
    mod = _routed(model, precision, layout)
    calls = _calls(mod)
    nhwc = int(layout == "last")
    tensor = int(precision == "float16")
    # layout, pads, strides, dilations, groups, bias, residual, relu, math; c6's asymmetric pad is not routed
    assert calls == [[nhwc, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, tensor],
                     [nhwc, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, tensor],
                     [nhwc, 1, 1, 1, 1, 1, 1, 16, 1, 0, tensor, tensor],  # fp16: Clip(0, 6) is min(relu, 6)
                     [nhwc, 2, 2, 2, 2, 2, 2, 1, 1, 0, 0, tensor],
                     [nhwc, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, tensor]]
    assert "R.nn.conv2d(" in mod["main"].script()  # the asymmetric one stays TVM's
    x = np.random.default_rng(1).standard_normal((2, 3, 20, 20)).astype(np.float32)
    out, ref = _run(mod, [x]), ort_run(model, {"x": x})[0]
    if precision == "float32":
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    else:
        cosine = float(np.dot(out.ravel(), ref.ravel()) / np.linalg.norm(out) / np.linalg.norm(ref))
        assert cosine > 0.9995, cosine


def test_a_symbolic_batch_stays_symbolic_and_runs_at_two_sizes():
    model = _model(batch="N")
    mod = _routed(model, "float32", None)
    assert len(_calls(mod)) == 5
    exe = tvm.compile(mod, target="llvm")
    vm = tvm.relax.VirtualMachine(exe, tvm.cpu())
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 20, 20)).astype(np.float32)
        np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), ort_run(model, {"x": x})[0],
                                   rtol=1e-4, atol=1e-4)


def test_an_fp32_result_of_fp16_inputs_feeding_fp32_stays_tvms():
    """The fp16 build's last convolution feeds the fp32 output directly (no cast back to fp16 follows):
    cuDNN writes the inputs' dtype, so that convolution keeps TVM's kernel rather than losing precision."""
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w])
    mod = _routed(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "float16", None)
    assert _calls(mod) == [] and "R.nn.conv2d(" in mod["main"].script()


def test_each_convolution_runs_once_when_its_result_has_other_readers():
    """``add(p, block(p))`` with ``p`` (a projection conv) also read by the next layer: the residual pattern
    matched ``p``'s conv with the later block as its residual and left ``p``'s own call for the other reader,
    so MobileNetV2 made 57 cuDNN calls for 52 convolutions.  Inner values of a chain must have one reader."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32), f"w{i}")
             for i in range(3)] + [numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w0", "b"], ["p"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["p", "w1", "b"], ["q"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["p", "q"], ["z"]),
             helper.make_node("Conv", ["z", "w2", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "p"], ["y"])]
    graph = helper.make_graph(nodes, "proj", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 6, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mod = _routed(model, "float32", None)
    assert len(_calls(mod)) == 3
    x = rng.standard_normal((1, 8, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(_run(mod, [x]), ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)
