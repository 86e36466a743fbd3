"""The cuDNN extension of CUDA artifacts (forgekit/backends/cuda/cudnn.py, ext/forgekit_cudnn.cc), built and
linked here against NVIDIA's wheels without a GPU: which builds carry it, what the library then needs, what
the metadata says, and what a user who asks for it without the wheel is told.  The call itself runs on a GPU
only (bench/gpu_run.py); the graph rewrite is checked numerically in test_cudnn_route.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.unit.test_cudnn_route import _model

pytest.importorskip("tvm")
cudnn = pytest.importorskip("forgekit.backends.cuda.cudnn")
if cudnn.find_cudnn() is None:
    pytest.skip("NVIDIA's cuDNN wheel is not installed (pip install 'forgekit[cuda]')", allow_module_level=True)


def _needed(library: Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    return [line.split("[")[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]


def _exports(library: Path) -> str:
    return subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True,
                          check=True).stdout


def _compile(tmp_path: Path, name: str, model, **kwargs):
    import forgekit as forge

    out = tmp_path / name
    forge.from_onnx(model).compile(target="cuda/sm_90", output_path=str(out), **kwargs)
    return out, json.loads((out / "metadata.json").read_text())


@pytest.mark.parametrize("fp16", [False, True])
def test_a_cudnn_build_carries_the_extension_and_names_its_library(tmp_path, fp16):
    out, meta = _compile(tmp_path, "cudnn", _model(batch="N"), gpu_kernels="cudnn", set_float16=fp16)
    library = out / "model_library.so"
    assert "__tvm_ffi_forgekit_cudnn_conv2d" in _exports(library)
    # by soname, resolved where it runs (the runtime loads NVIDIA's wheels first), not a path of this machine
    assert {"libcudnn.so.9", "libcudart.so.13"} <= set(_needed(library))
    assert "RUNPATH" not in subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True).stdout
    assert meta["build"]["device"]["libraries"] == "libcudnn.so.9"


def test_tvm_kernels_and_models_without_convolutions_need_no_cudnn(tmp_path):
    out, meta = _compile(tmp_path, "tvm", _model(), gpu_kernels="tvm")
    assert "forgekit_cudnn" not in _exports(out / "model_library.so")
    assert "libcudnn.so.9" not in _needed(out / "model_library.so") and "libraries" not in meta["build"]["device"]
    rng = __import__("numpy").random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype("float32"), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], [w])
    out, meta = _compile(tmp_path, "matmul", helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                         gpu_kernels="cudnn")
    assert "libcudnn.so.9" not in _needed(out / "model_library.so") and "libraries" not in meta["build"]["device"]


def test_asking_for_cudnn_without_the_wheel_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
    from forgekit.errors import ToolchainError

    monkeypatch.setattr(cudnn, "find_cudnn", lambda: None)
    with pytest.raises(ToolchainError, match=r"pip install nvidia-cudnn-cu13.*--gpu-kernels tvm"):
        _compile(tmp_path, "missing", _model(), gpu_kernels="cudnn")
    assert not (tmp_path / "missing").exists()


def test_auto_uses_cudnn_where_installed_and_tvm_where_not(tmp_path, monkeypatch):
    _, meta = _compile(tmp_path, "auto", _model())
    assert meta["build"]["device"]["libraries"] == "libcudnn.so.9"
    monkeypatch.setattr(cudnn, "find_cudnn", lambda: None)
    _, meta = _compile(tmp_path, "auto-without", _model())
    assert "libraries" not in meta["build"]["device"]


def test_a_bad_spelling_is_one_usage_line():
    from forgekit.errors import UsageError
    from forgekit.options import CompileOptions

    with pytest.raises(UsageError, match="use auto, tvm, cudnn or vendor"):
        CompileOptions(gpu_kernels="cublas")
    assert CompileOptions(gpu_kernels="CUDNN").gpu_kernels == "cudnn"


def test_a_jetson_build_never_links_this_machines_cudnn(tmp_path):
    """jetson/orin's host is aarch64: ``auto`` linked the x86-64 wheel's libcudnn.so.9 into it and the link
    failed (exit 6, "ld returned 1"); now ``auto`` is TVM's kernels there and ``cudnn`` one line (exit 10)."""
    import shutil

    from forgekit.errors import ToolchainError

    if shutil.which("aarch64-linux-gnu-g++") is None:
        pytest.skip("needs the aarch64 cross compiler (g++-aarch64-linux-gnu)")
    import forgekit as forge

    forge.from_onnx(_model()).compile(target="jetson/orin", output_path=str(tmp_path / "orin"))
    assert "libraries" not in json.loads((tmp_path / "orin" / "metadata.json").read_text())["build"]["device"]
    with pytest.raises(ToolchainError, match="aarch64 hosts"):
        forge.from_onnx(_model()).compile(target="jetson/orin", output_path=str(tmp_path / "orin2"),
                                          gpu_kernels="cudnn")
    assert not (tmp_path / "orin2").exists()
