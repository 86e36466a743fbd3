"""Matmuls routed to cuBLAS on CUDA targets (``--gpu-kernels vendor``, forgekit/backends/cuda/cublas.py): which
matmuls become one ``forgekit_cublas_matmul`` call, that the rewritten graph computes what onnxruntime does, and
that a CUDA build carries and links the extension.  No GPU here: the rewritten module is built for the CPU with
``forgekit_cublas_matmul`` registered as a numpy implementation of the call's documented contract
(ext/forgekit_cublas.cc's header), so a wrong operand order, batch stride or dtype in the rewrite shows up as a
wrong output.  The C++ call runs on a GPU only (bench/gpu_run.py: not yet, none was lent after it was written)."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import ort_run

tvm = pytest.importorskip("tvm")


def _reference_matmul(args: list) -> None:
    """y = a @ b (b: [K, N] under any a, or a's batch dims), fp32 accumulation, rounded once to y's dtype."""
    a, b, attrs, y = args
    assert [int(v) for v in attrs] in ([0], [1])
    a, b = a.numpy().astype(np.float32), b.numpy().astype(np.float32)
    assert b.ndim == 2 or b.shape[:-2] == a.shape[:-2], (a.shape, b.shape)
    y.copyfrom((a @ b).astype(str(y.dtype)))


@pytest.fixture(scope="module", autouse=True)
def numpy_cublas():
    import tvm_ffi

    from forgekit.backends.cuda.cublas import FUNCTION

    tvm_ffi.register_global_func(FUNCTION, lambda *args: _reference_matmul(list(args)), override=True)


def _attention_block(batch: int | str = 2, seq: int = 6, dim: int = 8, heads: int = 2) -> object:
    """A transformer block's matmul classes: Linear layers with bias on a 3-D input (a weight under batch and
    sequence), attention's q @ k^T and p @ v (4-D, batched), and a GELU MLP."""
    rng = np.random.default_rng(0)
    inits, nodes = [], []

    def linear(name, x, cin, cout):
        inits.append(numpy_helper.from_array((rng.standard_normal((cin, cout)) / np.sqrt(cin)).astype(np.float32),
                                             f"{name}_w"))
        inits.append(numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32) * 0.1, f"{name}_b"))
        nodes.append(helper.make_node("MatMul", [x, f"{name}_w"], [f"{name}_m"]))
        nodes.append(helper.make_node("Add", [f"{name}_m", f"{name}_b"], [name]))
        return name

    dh = dim // heads
    inits.append(numpy_helper.from_array(np.array([0, 0, heads, dh], np.int64), "split"))
    inits.append(numpy_helper.from_array(np.array([0, 0, dim], np.int64), "merge"))
    inits.append(numpy_helper.from_array(np.float32(1 / np.sqrt(dh)), "scale"))
    for t in ("q", "k", "v"):
        linear(t, "x", dim, dim)
        nodes.append(helper.make_node("Reshape", [t, "split"], [f"{t}_r"]))
        perm = [0, 2, 3, 1] if t == "k" else [0, 2, 1, 3]  # k transposed for q @ k^T
        nodes.append(helper.make_node("Transpose", [f"{t}_r"], [f"{t}_h"], perm=perm))
    nodes += [helper.make_node("MatMul", ["q_h", "k_h"], ["s"]), helper.make_node("Mul", ["s", "scale"], ["s2"]),
              helper.make_node("Softmax", ["s2"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v_h"], ["o"]),
              helper.make_node("Transpose", ["o"], ["o_t"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["o_t", "merge"], ["o_m"])]
    linear("up", "o_m", dim, 2 * dim)
    nodes.append(helper.make_node("Gelu", ["up"], ["g"], domain="com.microsoft"))
    linear("down", "g", 2 * dim, dim)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, dim])
    y = helper.make_tensor_value_info("down", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "block", [x], [y], inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def _routed(model, precision: str):
    from forgekit.backends.cuda.cublas import route_matmuls
    from forgekit.model.facade import from_onnx
    from forgekit.passes import graph_passes

    mod = tvm.transform.Sequential(graph_passes(3, precision=precision))(from_onnx(model).mod)
    return route_matmuls(mod)


def _calls(mod) -> int:
    """How many ``call_dps_packed`` calls ``main`` makes (an ExternFunc as the first argument)."""
    from tvm import relax

    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.args and isinstance(expr.args[0], relax.ExternFunc):
            found.append(str(expr.args[0].global_symbol))

    relax.analysis.post_order_visit(mod["main"], visit)
    assert set(found) <= {"forgekit_cublas_matmul"}, found
    return len(found)


def _run(mod, x: np.ndarray) -> np.ndarray:
    exe = tvm.compile(mod, target="llvm")
    return tvm.relax.VirtualMachine(exe, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


@pytest.mark.parametrize("precision", ["float32", "float16"])
def test_matmuls_become_cublas_calls_and_match_onnxruntime(precision):
    """All seven matmuls (five Linear layers, q @ k^T, p @ v) become calls, their epilogues stay Relax, and the
    block computes what onnxruntime does (fp32 within 1e-5; fp16 against fp32 onnxruntime, cosine > 0.9995)."""
    model = _attention_block()
    mod = _routed(model, precision)
    script = mod["main"].script()
    assert _calls(mod) == 7 and "R.matmul(" not in script
    assert "R.add(" in script  # the biases: TVM fuses them with the call's reader
    x = np.random.default_rng(1).standard_normal((2, 6, 8)).astype(np.float32)
    out, ref = _run(mod, x), ort_run(model, {"x": x})[0]
    if precision == "float32":
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    else:
        cosine = float(np.dot(out.ravel(), ref.ravel()) / np.linalg.norm(out) / np.linalg.norm(ref))
        assert cosine > 0.9995, cosine


def test_a_symbolic_batch_stays_symbolic_and_runs_at_two_sizes():
    model = _attention_block(batch="N")
    mod = _routed(model, "float32")
    assert _calls(mod) == 7
    exe = tvm.compile(mod, target="llvm")
    vm = tvm.relax.VirtualMachine(exe, tvm.cpu())
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 6, 8)).astype(np.float32)
        np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), ort_run(model, {"x": x})[0],
                                   rtol=1e-5, atol=1e-5)


def test_matmuls_cublas_cannot_take_as_they_are_stay_tvms():
    """A broadcast batch ([2, 1, K, N] under [2, 3, M, K]), an integer matmul, and an fp16 matmul whose fp32 result
    is the model's output (cuBLAS writes the inputs' dtype) keep TVM's kernels."""
    from tvm import relax

    from forgekit.backends.cuda.cublas import route_matmuls

    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType([2, 3, 4, 5], "float32"))
    i = relax.Var("i", relax.TensorType([4, 5], "int32"))
    h = relax.Var("h", relax.TensorType([4, 5], "float16"))
    with bb.function("main", [a, i, h]):
        with bb.dataflow():
            broadcast = bb.emit(relax.op.matmul(a, relax.const(np.ones((2, 1, 5, 4), np.float32))))
            integer = bb.emit(relax.op.matmul(i, relax.const(np.ones((5, 4), np.int32))))
            wide = bb.emit(relax.op.matmul(h, relax.const(np.ones((5, 4), np.float16)), out_dtype="float32"))
            out = bb.emit_output(relax.Tuple([broadcast, integer, wide]))
        bb.emit_func_output(out)
    mod = route_matmuls(bb.get())
    assert _calls(mod) == 0 and mod["main"].script().count("R.matmul(") == 3


def _have_cuda_build() -> bool:
    from forgekit.backends.cuda.cublas import find_cublas
    from forgekit.backends.cuda.nvcc import _wheel_nvcc

    return find_cublas() is not None and bool(_wheel_nvcc())


@pytest.mark.skipif(not _have_cuda_build(), reason="needs nvcc and cuBLAS (pip install 'forgekit[cuda]')")
def test_a_vendor_build_carries_the_extension_and_names_its_library(tmp_path):
    import forgekit as forge

    out = tmp_path / "vendor"
    forge.from_onnx(_attention_block()).compile(target="cuda/sm_90", output_path=str(out), gpu_kernels="vendor")
    library, meta = out / "model_library.so", json.loads((out / "metadata.json").read_text())
    exports = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True).stdout
    needed = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True).stdout
    assert "__tvm_ffi_forgekit_cublas_matmul" in exports and "[libcublas.so.13]" in needed
    assert "libcublas.so.13" in meta["build"]["device"]["libraries"].split()
    # auto leaves matmuls to TVM (cuBLAS is not measured on a GPU yet): no extension, no library
    plain = tmp_path / "auto"
    forge.from_onnx(_attention_block()).compile(target="cuda/sm_90", output_path=str(plain))
    assert "forgekit_cublas" not in subprocess.run(["nm", "-D", "--defined-only", str(plain / "model_library.so")],
                                                   capture_output=True, text=True).stdout
