"""The Arm side of a TIDL-offloaded model, run for real against a mock of TI's TIDL-RT C library.

plan -> split into ONNX subgraphs -> forgekit imports and compiles the rest for this CPU with each subgraph a
``forgekit.tidl.subgraph_<i>`` call -> the glue (:mod:`forgekit.offload.tidl_rt`) fills TIDL-RT tensor structs
and calls ``TIDLRT_invoke`` of the mock (C, built here with ``cc``), whose "network" runs the subgraph in
onnxruntime.  TI's real library and the C7x/MMA are not here: what is checked is forgekit's side of the call.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm_ffi
from onnx import TensorProto, helper, numpy_helper

from forgekit.errors import ArtifactError, InputError
from forgekit.offload import tidlrt_mock
from forgekit.model.tidl import partition
from forgekit.offload.tidl_partition import DOMAIN
from forgekit.offload.tidl_rt import TidlRuntime, TidlrtTensor, fill_tensor, load_library
from forgekit.runtime import Engine


def branchy_cnn() -> onnx.ModelProto:
    """conv+relu (TIDL) | 5x5 max pool (Arm) | concat(pool, relu) conv/s2 SiLU conv1x1 -> feat (TIDL) | softmax and
    ReduceMax over channels -> prob, score (Arm, computed by forgekit's kernels).  The second subgraph has two
    inputs, one from the Arm cores and one from the first subgraph, so TI's merge rule keeps them apart."""
    rng = np.random.default_rng(0)
    w = lambda *s: rng.standard_normal(s) / np.sqrt(np.prod(s[1:]))  # noqa: E731
    inits = {"w1": w(8, 3, 3, 3), "b1": rng.standard_normal(8) * 0.1, "w2": w(16, 16, 3, 3), "w3": w(6, 16, 1, 1),
             "axes": np.array([1], np.int64)}
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4, name="conv1"), n("Relu", ["c1"], ["r1"], name="relu1"),
             n("MaxPool", ["r1"], ["p"], kernel_shape=[5, 5], pads=[2] * 4, name="pool5"),
             n("Concat", ["p", "r1"], ["cat"], axis=1, name="cat"),
             n("Conv", ["cat", "w2"], ["c2"], pads=[1] * 4, strides=[2, 2], name="conv2"),
             n("Sigmoid", ["c2"], ["s2"], name="sig"), n("Mul", ["c2", "s2"], ["m2"], name="silu"),
             n("Conv", ["m2", "w3"], ["feat"], name="conv3"),
             n("Softmax", ["feat"], ["prob"], axis=1, name="softmax"),
             n("ReduceMax", ["feat", "axes"], ["score"], keepdims=0, name="score")]
    graph = helper.make_graph(nodes, "branchy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("score", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v if v.dtype == np.int64 else v.astype(np.float32), k)
                               for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def mock_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tidlrt_mock.build(tmp_path_factory.mktemp("tidlrt"))


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory):
    model = branchy_cnn()
    plan, ir, subgraphs = partition(model, "ti/am68a")
    out = tmp_path_factory.mktemp("tidl-arm") / "artifact"
    ir.compile(output_path=out)
    return model, plan, subgraphs, out


def test_split_replaces_each_subgraph_by_one_call(compiled) -> None:
    model, plan, subgraphs, _ = compiled
    assert {n.name: n.subgraph for n in plan.nodes} == {"conv1": 0, "relu1": 0, "pool5": None, "cat": 1, "conv2": 1,
                                                       "sig": 1, "silu": 1, "conv3": 1, "softmax": None,
                                                       "score": None}
    assert [(s.index, s.inputs, s.outputs) for s in subgraphs] == [(0, ["x"], ["r1"]), (1, ["p", "r1"], ["feat"])]
    assert [[n.op_type for n in s.model.graph.node] for s in subgraphs] == [
        ["Conv", "Relu"], ["Concat", "Conv", "Sigmoid", "Mul", "Conv"]]
    for s in subgraphs:  # each stands alone: what TI's import compiles into a *_tidl_net.bin
        onnx.checker.check_model(s.model, full_check=True)
    assert DOMAIN == "forgekit.tidl"


def test_partitioned_model_runs_through_mock_tidlrt_and_matches_onnxruntime(compiled, mock_lib, tmp_path) -> None:
    model, _, subgraphs, artifact = compiled
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    binaries = [tidlrt_mock.write_binaries(s, tmp_path / "tidl") for s in subgraphs]
    rng = np.random.default_rng(3)
    with TidlRuntime(binaries, mock_lib) as runtime:
        dsp = tidlrt_mock.OnnxruntimeCompute(runtime.lib)
        engine = Engine(artifact)  # after the glue: the VM resolves forgekit.tidl.subgraph_<i> when it loads
        for _ in range(2):
            x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
            prob, score = engine.infer(x)
            want_prob, want_score = reference.run(None, {"x": x})
            np.testing.assert_allclose(prob, want_prob, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(score, want_score, rtol=1e-4, atol=1e-4)
            assert score.shape == (1, 16, 16) and np.abs(score).max() > 0.1  # not a trivially zero model
        assert dsp.error is None
        # once per subgraph per inference, in graph order, with the tensors as TIDL-RT got them from the structs
        f32 = "float32"
        per_run = [{"inputs": [("x", (1, 3, 32, 32), f32)], "outputs": [("r1", (1, 8, 32, 32), f32)]},
                   {"inputs": [("p", (1, 8, 32, 32), f32), ("r1", (1, 8, 32, 32), f32)],
                    "outputs": [("feat", (1, 6, 16, 16), f32)]}]
        assert [{k: c[k] for k in ("inputs", "outputs")} for c in dsp.calls] == per_run * 2
        assert len({c["net"] for c in dsp.calls}) == 2
        lib = runtime.lib
        lib.tidlrt_mock_invocations.restype, lib.tidlrt_mock_invocations.argtypes = ctypes.c_int64, [ctypes.c_void_p]
        assert [lib.tidlrt_mock_invocations(runtime.handle(i)) for i in (0, 1)] == [2, 2]
        assert lib.tidlrt_mock_live_handles() == 2
    assert lib.tidlrt_mock_live_handles() == 0  # close() deleted both instances
    assert tvm_ffi.get_global_func("forgekit.tidl.subgraph_0", allow_missing=True) is None
    with pytest.raises(Exception, match="TIDL subgraph 0 was closed"):
        engine.infer(x)


class FaultyDsp(tidlrt_mock.OnnxruntimeCompute):
    def _session(self, net: bytes, key: str) -> None:
        raise RuntimeError("DSP fault")


def test_a_failing_invoke_is_one_line(compiled, mock_lib, tmp_path) -> None:
    _, _, subgraphs, artifact = compiled
    binaries = [tidlrt_mock.write_binaries(s, tmp_path) for s in subgraphs]
    with TidlRuntime(binaries, mock_lib) as runtime:
        dsp = FaultyDsp(runtime.lib)
        with pytest.raises(Exception) as info:  # the VM passes the glue's error on (as a RuntimeError)
            Engine(artifact).infer(np.zeros((1, 3, 32, 32), np.float32))
    message = str(info.value).strip()
    assert "\n" not in message
    assert "TIDLRT_invoke failed for subgraph 0: TIDLRT_invoke: the compute function failed." in message
    assert dsp.error == "RuntimeError: DSP fault"


def test_refusals_are_one_line(compiled, mock_lib, tmp_path) -> None:
    _, _, subgraphs, artifact = compiled
    binaries = [tidlrt_mock.write_binaries(s, tmp_path) for s in subgraphs]
    with pytest.raises(ArtifactError, match=r"TIDL-RT library '/nonexistent/libvx_tidl_rt.so' does not load") as info:
        TidlRuntime(binaries, "/nonexistent/libvx_tidl_rt.so")
    assert "FORGEKIT_TIDLRT_LIB" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ArtifactError, match="has no TIDLRT_setParamsDefault: it is not a TIDL-RT library"):
        load_library("libm.so.6")
    (tmp_path / "subgraph_1_tidl_io_1.bin").write_bytes(b"TI's own descriptor")
    with pytest.raises(ArtifactError, match="subgraph 1 .*the I/O descriptor is not the mock's"):
        TidlRuntime(binaries, mock_lib)
    assert load_library(mock_lib).tidlrt_mock_live_handles() == 0  # subgraph 0's instance was deleted again
    with pytest.raises(ArtifactError, match="Cannot find ffi::Function forgekit.tidl.subgraph_"):
        # the runtimes above are closed and their functions gone: the model refuses to load, naming the call
        Engine(artifact)
    lib = load_library(mock_lib)
    with pytest.raises(InputError, match=r"shape \(1, 3, 6, 16, 16\): TIDL-RT tensors have 1-4 dimensions"):
        fill_tensor(lib, TidlrtTensor(), "h5", (1, 3, 6, 16, 16), "float32", 1)
