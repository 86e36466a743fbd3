"""A kernel DLight's GPU rules misread does not fail a CUDA build: the rule that raises passes it to the next
one (forgekit/backends/cuda/pipeline.py, ``guarded_default_schedule``).  Built here without a GPU; what the
schedules compute is TVM's (run on a GPU by bench/gpu_run.py)."""

from __future__ import annotations

import logging
import os
import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit


def _have_nvcc() -> bool:
    from forgekit.backends.cuda.nvcc import _wheel_nvcc

    return bool(os.environ.get("CUDA_HOME") or shutil.which("nvcc") or _wheel_nvcc())


pytestmark = pytest.mark.skipif(not _have_nvcc(), reason="needs nvcc (pip install 'forgekit[cuda]')")


def _depthwise(spatial: int):
    """A depthwise conv (32 channels, 5 taps) over a length of 100, 1-D or 2-D of height 1."""
    c = 32
    w = np.random.default_rng(0).standard_normal((c, 1, *[1] * (spatial - 1), 5)).astype(np.float32)
    dims = [1, c, *[1] * (spatial - 1), 100]
    conv = helper.make_node("Conv", ["x", "w"], ["y"], group=c, pads=([0] * (spatial - 1) + [2]) * 2)
    graph = helper.make_graph([conv], "m",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("spatial", [1, 2])
def test_a_depthwise_conv_builds_with_tvm_kernels(tmp_path, caplog, spatial: int) -> None:
    """DLight's GEMV rule asserted on it ("'Add' object has no attribute 'value'", compile exit 6)."""
    with caplog.at_level(logging.DEBUG, logger="forgekit.backends.cuda"):
        result = forgekit.from_onnx(_depthwise(spatial)).compile(target="cuda/sm_90", output_path=tmp_path / "a",
                                                                  gpu_kernels="tvm")
    assert (result.path / "model_library.so").stat().st_size > 0
    assert "GEMV raised" in caplog.text  # the case this covers: one rule raised, the next one took the kernel
