"""``Engine(path, cuda_graphs=True)`` (issue 37.3): what this machine (no GPU) can check.  The capture and the
replay themselves run on a GPU only: ``bench/gpu_run.py`` checks each artifact's replayed outputs against
onnxruntime, and a replay on new input values against the same artifact without graphs."""

from __future__ import annotations

import numpy as np
import pytest

from forgekit.errors import UsageError
from forgekit.runtime import Engine
from forgekit.runtime.cuda_graph import _Cudart, signature


def test_cuda_graphs_on_a_cpu_engine_is_one_usage_line(convnet_compiled) -> None:
    with pytest.raises(UsageError, match="CUDA graphs run CUDA artifacts, and this engine runs on cpu"):
        Engine(convnet_compiled, cuda_graphs=True)
    assert Engine(convnet_compiled).cuda_graphs is None


def test_one_graph_per_shape_and_dtype_whatever_holds_the_input() -> None:
    """A host array and a DLPack tensor of the same shape and dtype replay the same graph; another batch or
    dtype gets its own."""
    import tvm_ffi

    x = np.zeros((2, 3, 8, 8), np.float32)
    assert signature([x]) == signature([tvm_ffi.from_dlpack(x)]) == (((2, 3, 8, 8), "<f4"),)
    assert signature([x[:1]]) != signature([x])
    assert signature([x.astype(np.float16)]) != signature([x])
    assert signature([x, np.arange(4)]) == (((2, 3, 8, 8), "<f4"), ((4,), np.dtype(np.int_).str))


def test_every_cuda_runtime_call_exists_in_libcudart() -> None:
    """The calls a capture makes resolve in the CUDA runtime a CUDA engine loads (NVIDIA's wheel: a wrong name
    would otherwise fail only on a GPU machine, at the first capture), and its errors read as CUDA's words."""
    import ctypes

    from forgekit.runtime.device import _wheel_cudart

    path = _wheel_cudart()
    if path is None:
        pytest.skip("NVIDIA's CUDA runtime wheel is not installed (pip install 'forgekit[cuda]')")
    cuda = _Cudart(ctypes.CDLL(str(path)))  # resolves every declared symbol: AttributeError for a missing one
    assert {"cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiateWithFlags", "cudaGraphLaunch",
            "cudaGraphExecDestroy"} <= set(_Cudart.SIGNATURES)
    assert "stream is capturing" in cuda.error(900)  # cudaErrorStreamCaptureUnsupported: no GPU needed


def test_run_cuda_graphs_on_a_cpu_artifact_is_exit_2(convnet_compiled) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "forgekit", "run", str(convnet_compiled), "--random", "--cuda-graphs"],
                          capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "CUDA graphs run CUDA artifacts" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
