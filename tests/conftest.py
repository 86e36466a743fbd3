"""Shared fixtures: tiny ONNX models built in code, the onnx wheel's light models, onnxruntime."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

# Tolerances used throughout: outputs are compared against onnxruntime with these unless a test says
# otherwise (atol is relative to the output's scale: atol * max|reference|).
RTOL = 1e-3
ATOL = 1e-4


def assert_close(actual: np.ndarray, expected: np.ndarray, rtol: float = RTOL, atol: float = ATOL) -> None:
    """allclose with atol scaled by the reference's magnitude, and a readable failure."""
    expected = np.asarray(expected)
    actual = np.asarray(actual).reshape(expected.shape)
    scale = float(np.max(np.abs(expected))) or 1.0
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol * scale)


def make_convnet(seed: int = 0, batch: int | str = "N", with_bn: bool = True) -> onnx.ModelProto:
    """Conv(3→8,3x3) → BatchNorm → Relu → GlobalAveragePool → Flatten → Gemm(8→10) → Softmax."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "conv_w"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "conv_b"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "bn_scale"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "bn_bias"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "bn_mean"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "bn_var"),
        numpy_helper.from_array(rng.standard_normal((10, 8)).astype(np.float32), "fc_w"),
        numpy_helper.from_array(rng.standard_normal(10).astype(np.float32), "fc_b"),
    ]
    nodes = [helper.make_node("Conv", ["input", "conv_w", "conv_b"], ["conv"], pads=[1, 1, 1, 1], name="conv1")]
    last = "conv"
    if with_bn:
        nodes.append(helper.make_node("BatchNormalization", ["conv", "bn_scale", "bn_bias", "bn_mean", "bn_var"],
                                      ["bn"], epsilon=1e-5, name="bn1"))
        last = "bn"
    nodes += [
        helper.make_node("Relu", [last], ["relu"], name="relu1"),
        helper.make_node("GlobalAveragePool", ["relu"], ["pool"], name="pool"),
        helper.make_node("Flatten", ["pool"], ["flat"], axis=1, name="flatten"),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1, name="fc"),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=1, name="softmax"),
    ]
    graph = helper.make_graph(
        nodes, "tiny_convnet",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, 16, 16])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, 10])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="forgekit-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def make_two_output_model() -> onnx.ModelProto:
    """Two inputs (a: 2x4, b: 2x4) → (a+b, a*b): exercises multiple inputs/outputs and names."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Mul", ["a", "b"], ["prod"])],
        "two_out",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("sum", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("prod", TensorProto.FLOAT, [2, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def make_unsupported_model() -> onnx.ModelProto:
    """A graph whose two DeformConv nodes and com.microsoft.FusedConv node forgekit cannot import (not
    checked).  Neither TVM 0.27 nor forgekit converts DeformConv, nobody converts FusedConv: exactly two
    operator types are unsupported.  (This fixture used LSTM, then Loop, then Scan, before forgekit converted
    them.)"""
    graph = helper.make_graph(
        [helper.make_node("DeformConv", ["x", "w", "offset"], ["y"], name="deform_a"),
         helper.make_node("DeformConv", ["y", "w", "offset"], ["y2"], name="deform_b"),
         helper.make_node("FusedConv", ["y2"], ["z"], domain="com.microsoft", name="fused"),
         helper.make_node("Relu", ["z"], ["out"], name="relu")],
        "unsupported",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 1, 4, 4])],
        initializer=[numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "w"),
                     numpy_helper.from_array(np.zeros((1, 2, 4, 4), np.float32), "offset")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model


def scheduled_kernels(model: Any, shape_dict: dict, opt_level: int = 3) -> tuple[Any, Any]:
    """Compile ``model`` for the host and return (the module as the Relax->TIR pipeline leaves it, before
    TIR lowering; the inference function): what tests of the CPU schedules read the kernels from."""
    import tvm

    import forgekit

    captured = {}
    real = tvm.compile

    def capture(mod: Any, target: Any = None, relax_pipeline: Any = None, **kwargs: Any) -> Any:
        captured["mod"] = relax_pipeline(mod)
        return real(mod, target=target, relax_pipeline=relax_pipeline, **kwargs)

    tvm.compile = capture
    try:
        run = forgekit.from_onnx(model, shape_dict).get_inference_function("host", opt_level=opt_level)
    finally:
        tvm.compile = real
    return captured["mod"], run


def library_ir(model: Any) -> str:
    """The LLVM IR of ``model``'s host library, built as ``forgekit compile -t host`` builds it
    (forgekit.build._lower: the backend's Relax and TIR pipelines)."""
    import tvm

    import forgekit
    from forgekit.backends.pipeline import build_scope, lowering_pipeline, tir_pipeline
    from forgekit.build import tvm_target_for
    from forgekit.targets.parse import parse_target

    spec = parse_target("host")
    target = tvm_target_for(spec, 3)
    with target, build_scope(spec, 3):
        mod = forgekit.from_onnx(model).mod
        executable = tvm.compile(mod, target=target, relax_pipeline=lowering_pipeline(spec, target, 3),
                                 tir_pipeline=tir_pipeline(spec))
    [llvm] = executable.mod.imports
    return llvm.inspect_source("ll")


def vectorized_tir(func: Any) -> str:
    """A scheduled kernel through TVM's s_tir pipeline up to VectorizeLoop, in its order, with the passes forgekit's
    CPU pipeline puts first that shape loops (:func:`forgekit.backends.cpu.vector_lanes.power_of_two_vectors`,
    :func:`forgekit.backends.cpu.stack_tiles.keep_partition_hints`): what tests read
    to see whether a loop stayed vectorized (``T.Ramp``) or was scalarized."""
    import tvm
    import tvm.s_tir

    from forgekit.backends.cpu.stack_tiles import keep_partition_hints
    from forgekit.backends.cpu.vector_lanes import power_of_two_vectors

    s_tir, tirx = tvm.s_tir.transform, tvm.tirx.transform
    lower = tvm.transform.Sequential([
        power_of_two_vectors(), keep_partition_hints(), s_tir.LowerInitBlock(), s_tir.ConvertBlocksToOpaque(), s_tir.LowerOpaqueBlock(),
        tirx.FlattenBuffer(), tirx.NarrowDataType(32), s_tir.LoopPartition(), tirx.VectorizeLoop()])
    with tvm.target.Target("llvm"):
        return lower(tvm.IRModule({"main": func}))["main"].script()


def host_dot_kernel():
    """This host's int8 dot-product kernel (:class:`forgekit.backends.cpu.int8.DotKernel`: VNNI, sdot, or
    vpmaddwd on AVX2), None where it has none."""
    from forgekit.backends.cpu.int8 import dot_kernel
    from forgekit.targets import parse_target
    from forgekit.targets.isa import isa_info

    return dot_kernel(isa_info(parse_target("host").tvm_target()))


def ort_run(model: onnx.ModelProto | str | Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Reference outputs from onnxruntime (CPU, deterministic single-thread)."""
    import onnxruntime as ort

    from forgekit.evaluate.reference import EXACT_INT8

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    for key, value in EXACT_INT8.items():  # int8 without the saturating u8s8 path of CPUs with no VNNI
        options.add_session_config_entry(key, value)
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    report = yield
    if report.when == "call":
        item.stash[_PASSED] = report.passed
    return report


_PASSED = pytest.StashKey[bool]()


@pytest.fixture(autouse=True)
def _free_tmp_path_of_passing_tests(request: pytest.FixtureRequest) -> Any:
    """Delete a passing test's ``tmp_path`` right after it: pytest keeps every one until the run ends, and a
    full run writes tens of GB of artifacts (one compile of VGG-19 writes 575 MB, linking needs twice that
    in $TMPDIR).  A CI run on a disk with 0.8 GB left failed on that; failing tests keep theirs."""
    yield
    path = request.node.funcargs.get("tmp_path")
    if path is not None and request.node.stash.get(_PASSED, False):
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def convnet_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "convnet.onnx"
    onnx.save(make_convnet(), path)
    return path


@pytest.fixture(scope="session")
def convnet_input() -> np.ndarray:
    return np.random.default_rng(42).standard_normal((2, 3, 16, 16)).astype(np.float32)


@pytest.fixture(scope="session")
def convnet_compiled(convnet_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny convnet compiled for this CPU at batch 2 (shared by runtime and CLI tests)."""
    import forgekit

    out = tmp_path_factory.mktemp("artifacts") / "convnet"
    forgekit.from_onnx(convnet_path, {"input": [2, 3, 16, 16]}).compile(target="host", output_path=out)
    return out


def forgekit_bin() -> str:
    """The installed console script (the real binary users run)."""
    candidate = Path(sys.executable).parent / "forgekit"
    return str(candidate) if candidate.exists() else (shutil.which("forgekit") or "forgekit")


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    full_env.pop("GITHUB_ACTIONS", None) if env is None or "GITHUB_ACTIONS" not in env else None
    return subprocess.run([forgekit_bin(), *args], capture_output=True, text=True, cwd=cwd, env=full_env, timeout=900)


#: Source of ``guarded(shape, dtype)`` for child-process scripts: an array with PROT_NONE pages right before and
#: right after its memory, so a kernel that reads outside its input dies with SIGSEGV instead of passing.
GUARDED_BUFFER = r'''
import ctypes, mmap
import numpy as np


def guarded(shape, dtype):
    page = mmap.PAGESIZE
    count = int(np.prod(shape))
    nbytes = count * np.dtype(dtype).itemsize
    assert nbytes % page == 0, "whole pages, so the array ends where the second guard begins"
    buf = mmap.mmap(-1, nbytes + 2 * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for start in (base, base + page + nbytes):
        assert libc.mprotect(start, page, 0) == 0
    return np.frombuffer(buf, dtype, count, offset=page).reshape(shape)
'''
