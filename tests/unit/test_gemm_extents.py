"""Self-attention over a length derived from a dynamic dim (a strided pool's output) builds for CUDA
(forgekit/backends/cuda/gemm_extents.py).  DLight's Matmul rule failed on ``q @ k^T`` and ``p @ v`` there ("Can
only handle constant size stack allocation for now", exit 6) with TVM's kernels and with cuDNN's route.  Built
here without a GPU; the rewrite itself is checked by value on the CPU, where the same Relax module runs."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit
from forgekit.backends.cuda.gemm_extents import plain_gemm_extents_pass
from tests.unit.test_cuda_rules import _have_nvcc

HEADS, DIM = 8, 15  # PP-OCRv6 rec's SVTR attention: 120 channels in 8 heads


def _attention(stride: int = 8):
    """``x`` [B, 120, 1, W] -> a (1, 5) average pool of stride ``stride`` -> k [B, 8, 15, L] with
    L = (W - 5) // stride + 1, q = k^T, then ``softmax(q @ k) @ q`` and a projection over the channels."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array([0, HEADS, DIM, -1], np.int64), "shape"),
             numpy_helper.from_array(rng.standard_normal((DIM, 4)).astype(np.float32), "w")]
    nodes = [helper.make_node("AveragePool", ["x"], ["p"], kernel_shape=[1, 5], strides=[1, stride]),
             helper.make_node("Reshape", ["p", "shape"], ["k"]),
             helper.make_node("Transpose", ["k"], ["q"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "k"], ["s"]),
             helper.make_node("Softmax", ["s"], ["a"], axis=-1),
             helper.make_node("MatMul", ["a", "q"], ["o"]),
             helper.make_node("MatMul", ["o", "w"], ["y"])]
    graph = helper.make_graph(nodes, "attention",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", HEADS * DIM, 1, "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.skipif(not _have_nvcc(), reason="needs nvcc (pip install 'forgekit[cuda]')")
@pytest.mark.parametrize("kernels", ["tvm", "auto"])
def test_attention_over_a_pooled_length_builds_for_cuda(tmp_path, kernels: str) -> None:
    result = forgekit.from_onnx(_attention()).compile(target="cuda/sm_90", output_path=tmp_path / "a",
                                                      gpu_kernels=kernels)
    assert (result.path / "model_library.so").stat().st_size > 0


def _matmuls(mod) -> list:
    from tvm import relax

    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e) if isinstance(e, relax.Call)
                                    and getattr(e.op, "name", None) == "relax.matmul" else None)
    return found


def test_only_the_matmuls_with_two_derived_extents_read_a_variable() -> None:
    from tvm import tirx

    mod = plain_gemm_extents_pass()(forgekit.from_onnx(_attention()).mod)
    matmuls = _matmuls(mod)
    assert len(matmuls) == 3
    plain = [all(isinstance(d, (tirx.IntImm, tirx.Var)) for arg in m.args for d in arg.ty.shape.values)
             for m in matmuls]
    assert plain.count(True) == 2  # q @ k and a @ q; the projection (one derived extent, M) keeps its fusion
    # what the caller sees is unchanged: the output's length is still the pooled expression of W
    out = mod["main"].ret_ty.shape.values
    assert not isinstance(out[2], (tirx.IntImm, tirx.Var))


@pytest.mark.parametrize("width", [61, 200])
def test_the_rewritten_attention_matches_onnxruntime(width: int) -> None:
    """The rewrite runs on the CPU too (TVM's default schedules, which take any module): same values."""
    import tvm
    from tvm import relax

    model = _attention()
    mod = plain_gemm_extents_pass()(forgekit.from_onnx(model).mod)
    exe = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}))
    vm = relax.VirtualMachine(exe, tvm.cpu())
    x = np.random.default_rng(width).standard_normal((2, HEADS * DIM, 1, width)).astype(np.float32)
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
