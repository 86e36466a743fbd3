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
    """y = conv(x, w), fp32 accumulation, rounded once to y's dtype (the extension's contract)."""
    x, w, attrs, y = args
    nhwc, ph, pw, sh, sw, dh, dw, groups, _math = [int(v) for v in attrs]
    x, w = x.numpy().astype(np.float32), w.numpy().astype(np.float32)
    if nhwc:
        x, w = x.transpose(0, 3, 1, 2), w.transpose(0, 3, 1, 2)  # NHWC/OHWI -> NCHW/OIHW
    n = x.shape[0]
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
    y.copyfrom(out.astype(str(y.dtype)))


@pytest.fixture(scope="module", autouse=True)
def numpy_cudnn():
    import tvm_ffi

    from forgekit.backends.cuda.cudnn import FUNCTION

    tvm_ffi.register_global_func(FUNCTION, lambda *args: _reference_conv(list(args)), override=True)


def _model(batch: int | str = 2) -> object:
    """Every convolution class the rewrite covers: a 3-channel stem with bias+ReLU, a residual block,
    depthwise with ReLU6 (Clip), stride 2 with dilation, bias-free 1x1, and an asymmetric pad; the epilogues
    stay Relax around the calls."""
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


def _matches_onnxruntime(mod, model, x: np.ndarray, precision: str) -> None:
    """fp32 within 1e-4 of onnxruntime; fp16 (against fp32 onnxruntime) cosine above 0.9995."""
    out, ref = _run(mod, [x]), ort_run(model, {"x": x})[0]
    if precision == "float32":
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    else:
        cosine = float(np.dot(out.ravel(), ref.ravel()) / np.linalg.norm(out) / np.linalg.norm(ref))
        assert cosine > 0.9995, cosine


@pytest.mark.parametrize("precision,layout", [("float32", None), ("float16", None), ("float32", "last"),
                                              ("float16", "last")])
def test_convolutions_become_cudnn_calls_and_match_onnxruntime(precision, layout):
    model = _model()
    mod = _routed(model, precision, layout)
    nhwc, tensor = int(layout == "last"), int(precision == "float16")
    # layout, pads, strides, dilations, groups, math; c6's asymmetric pad [0, 0, 1, 1] is an explicit pad first
    assert _calls(mod) == [[nhwc, 1, 1, 1, 1, 1, 1, 1, tensor], [nhwc, 1, 1, 1, 1, 1, 1, 1, tensor],
                           [nhwc, 1, 1, 1, 1, 1, 1, 16, tensor], [nhwc, 2, 2, 2, 2, 2, 2, 1, tensor],
                           [nhwc, 0, 0, 1, 1, 1, 1, 1, tensor], [nhwc, 0, 0, 1, 1, 1, 1, 1, tensor]]
    script = mod["main"].script()
    assert script.count("R.nn.conv2d(") == 0 and script.count("R.nn.pad(") == 2  # the 3-channel stem, c6
    assert "R.nn.relu(" in script and "R.add(" in script  # epilogues stay Relax (fused by TVM)
    x = np.random.default_rng(1).standard_normal((2, 3, 20, 20)).astype(np.float32)
    _matches_onnxruntime(mod, model, x, precision)


def test_a_symbolic_batch_stays_symbolic_and_runs_at_two_sizes():
    model = _model(batch="N")
    mod = _routed(model, "float32", None)
    assert len(_calls(mod)) == 6
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


def test_an_fp16_convolution_whose_fp32_result_has_another_reader_runs_once():
    """``y = conv(x16, w16) -> fp32``, read by its cast to fp16 and by an fp32 op: folding the cast into the
    call would leave the convolution computed a second time for the other reader (a matched value read
    elsewhere made MobileNetV2 57 cuDNN calls for 52 convolutions while the rewrite fused epilogues).  It stays
    TVM's; a convolution read by its cast alone becomes the call."""
    from tvm import relax

    from forgekit.backends.cuda.cudnn import route_convolutions

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 8, 6, 6], "float16"))
    w = relax.const(np.ones((8, 8, 3, 3), np.float16))
    with bb.function("main", [x]):
        with bb.dataflow():
            shared = bb.emit(relax.op.nn.conv2d(x, w, padding=[1, 1, 1, 1], out_dtype="float32"))
            cast = bb.emit(relax.op.astype(shared, "float16"))
            other = bb.emit(relax.op.nn.softmax(shared))
            single = bb.emit(relax.op.astype(relax.op.nn.conv2d(cast, w, padding=[1, 1, 1, 1], out_dtype="float32"),
                                              "float16"))
            out = bb.emit_output(relax.Tuple([single, other]))
        bb.emit_func_output(out)
    mod = route_convolutions(bb.get(), tensor_ops=False)
    assert len(_calls(mod)) == 1 and mod["main"].script().count("R.nn.conv2d(") == 1


@pytest.mark.parametrize("precision", ["float32", "float16"])
def test_transposed_convolutions_reach_cudnn_in_fp32_and_fp16(precision):
    """PP-OCR det's 2x2/stride-2 ConvTranspose heads ran on TVM's conv2d_transpose kernel, 50-59 % of the
    model at batch 32 on an H200.  The CUDA pipeline rewrites them as convolutions first; in an fp16 build the
    transposed conv's fp32 result is cast back to fp16 by its reader, which the rewrite folds into each phase
    conv (so it becomes a cuDNN call too).  Both kinds plus a 3-channel stem (padded to the channel alignment)."""
    from forgekit.backends.cuda.cudnn import route_convolutions
    from forgekit.model.facade import from_onnx
    from forgekit.passes import graph_passes
    from forgekit.passes.conv_transpose import conv_transpose_as_conv

    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array((rng.standard_normal((8, 4, 2, 2)) * 0.3).astype(np.float32), "wt"),
             numpy_helper.from_array((rng.standard_normal((8, 4, 3, 3)) * 0.3).astype(np.float32), "w3"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "bt")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("ConvTranspose", ["r", "wt", "bt"], ["t"], strides=[2, 2], kernel_shape=[2, 2]),
             helper.make_node("Sigmoid", ["t"], ["s"]),
             helper.make_node("ConvTranspose", ["r", "w3"], ["u"], strides=[2, 2], pads=[1, 1, 1, 1],
                              output_padding=[1, 1]),
             helper.make_node("Add", ["s", "u"], ["y"])]
    graph = helper.make_graph(nodes, "ct", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 10, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 20, 20])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mod = tvm.transform.Sequential(graph_passes(3, precision=precision))(from_onnx(model).mod)
    mod = route_convolutions(conv_transpose_as_conv(mod), tensor_ops=False)
    script = mod["main"].script()
    assert "conv2d_transpose" not in script and "R.nn.conv2d(" not in script
    assert len(_calls(mod)) == 6  # stem + 1 phase conv (2x2/s2) + 4 phase convs (3x3/s2, asymmetric pads)
    assert "R.nn.pad(" in script  # the 3-channel stem, padded to the alignment
    x = rng.standard_normal((2, 3, 10, 10)).astype(np.float32)
    _matches_onnxruntime(mod, model, x, precision)
