"""Names are never code (forgekit/passes/names.py): ONNX input names and dimension names of every kind compile
for the CPU and for CUDA (nvcc), run and match onnxruntime, and the metadata keeps the original names.

Without the pass the CUDA build failed in nvcc (``float* __restrict__ gpu_0/data_0_ptr``: "expected a ')'")."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit as forge
from forgekit.passes.names import c_identifier, c_identifiers
from forgekit.runtime import Engine

#: the class: / : . - space, non-ASCII, a leading digit, C/CUDA keywords and built-ins, and two names that
#: sanitize to the same identifier (a/b and a:b)
NAMES = ["gpu_0/data_0", "serving_default_x:0", "input.1", "seq-len x", "größe", "0input", "int", "threadIdx",
         "a/b", "a:b"]
DIM = "batch size/1"  # a dim_param that is no identifier either


def names_model() -> onnx.ModelProto:
    """Each named input goes through a Conv (a real kernel with its own parameters) and the results are summed."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes, outs = [], []
    for i, name in enumerate(NAMES):
        nodes.append(helper.make_node("Conv", [name, "w"], [f"c{i}/out:0"], pads=[1, 1, 1, 1]))
        outs.append(f"c{i}/out:0")
    nodes.append(helper.make_node("Sum", outs, ["out.final:0"]))
    graph = helper.make_graph(
        nodes, "names", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [DIM, 3, 8, 8]) for n in NAMES],
        [helper.make_tensor_value_info("out.final:0", TensorProto.FLOAT, [DIM, 4, 8, 8])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def test_identifiers_are_valid_unique_and_stable() -> None:
    out = c_identifiers(NAMES + ["x", "x"])
    assert out[:8] == ["gpu_0_data_0", "serving_default_x_0", "input_1", "seq_len_x", "gr__e", "_0input", "int_",
                       "threadIdx_"]
    assert out[8:] == ["a_b", "a_b_1", "x", "x_1"]
    assert all(c_identifier(n) == n for n in ("x", "input_ids", "_a1"))


@pytest.mark.parametrize("opt_level", [0, 3])
def test_cpu_build_runs_and_keeps_onnx_names(tmp_path, opt_level) -> None:
    onnxruntime = pytest.importorskip("onnxruntime")
    model = names_model()
    forge.from_onnx(model).compile(target="host", output_path=tmp_path / "out", opt_level=opt_level)
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert [t["name"] for t in meta["model"]["inputs"]] == NAMES
    assert meta["model"]["outputs"][0]["name"] == "out.final:0"
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal((2, 3, 8, 8)).astype(np.float32) for n in NAMES}
    got = Engine(tmp_path / "out").infer(feeds)[0]
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(got, want[0], rtol=1e-4, atol=1e-4)


def _have_nvcc() -> bool:
    from forgekit.backends.cuda.nvcc import _wheel_nvcc

    return bool(os.environ.get("CUDA_HOME") or shutil.which("nvcc") or _wheel_nvcc())


@pytest.mark.skipif(not _have_nvcc(), reason="needs nvcc (pip install 'forgekit[cuda]')")
def test_cuda_build_compiles_every_name(tmp_path) -> None:
    result = forge.from_onnx(names_model()).compile(target="cuda/sm_90", output_path=tmp_path / "cuda")
    meta = json.loads((result.path / "metadata.json").read_text())
    assert [t["name"] for t in meta["model"]["inputs"]] == NAMES
    assert (result.path / "model_library.so").stat().st_size > 0
