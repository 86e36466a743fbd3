"""Every failure a user can cause is one line with the right exit code, nothing left behind, and the
terminal is quiet by default (the trust issue's list, item by item).  Run as users run it: the installed
``forgekit`` in a subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit
from conftest import forgekit_bin, make_convnet, run_cli
from forgekit.errors import CompileError, InputError


def one_line(proc: subprocess.CompletedProcess, code: int, *fragments: str) -> str:
    assert proc.returncode == code, proc.stderr + proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def gather_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An embedding lookup: TVM warns "Fast mode segfaults..." at every compile of a Gather."""
    emb = numpy_helper.from_array(np.random.default_rng(0).random((50, 8), dtype=np.float32), "emb")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["emb", "ids"], ["e"]), helper.make_node("ReduceMean", ["e"], ["y"], axes=[1],
                                                                             keepdims=0)],
        "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [emb])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path_factory.mktemp("gather") / "gather.onnx"
    onnx.save(model, path)
    return path


def test_quiet_by_default_verbose_on_request(gather_model: Path, tmp_path: Path) -> None:
    quiet = run_cli("compile", str(gather_model), "-o", str(tmp_path / "a"))
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    loud = run_cli("compile", str(gather_model), "-o", str(tmp_path / "b"), "--verbose")
    assert loud.returncode == 0 and "Fast mode segfaults" in loud.stderr


@pytest.mark.parametrize("after", [1.5, 3.0, 4.5, 7.0])  # importing Python, the ONNX import, the graph, kernels
def test_ctrl_c_during_a_compile_exits_130_and_leaves_nothing(tmp_path: Path, after: float) -> None:
    out = tmp_path / "out"
    # Ctrl-C as a terminal delivers it: a test run started in the background (CI scripts, `cmd &`) inherits
    # SIGINT ignored, which the compile rightly keeps (it exited 0 here when CI ran that way)
    proc = subprocess.Popen([forgekit_bin(), "compile", "sample:resnet50", "-o", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(after)  # importing and compiling ResNet-50 takes longer than this (16 s)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=300)
    *progress, last = stderr.strip().splitlines()
    # a loaded machine (CI) can reach the kernels before the signal: a log (no terminal) then has a line per
    # stage of a step that ran past QUIET_SECONDS, which is all that may precede the one error line
    assert proc.returncode == 130 and last == "error: interrupted", stderr
    assert all(line.startswith("compiling for ") and line.endswith("…") for line in progress), stderr
    assert list(tmp_path.iterdir()) == []


def test_unknown_cpu_lists_the_valid_ones(convnet_path: Path, tmp_path: Path) -> None:
    line = one_line(run_cli("compile", str(convnet_path), "-t", "llvm -mcpu=notacpu", "-o", str(tmp_path / "o")), 5,
                    "Unknown CPU 'notacpu'", "Valid CPUs:")
    assert "znver4" in line and "haswell" in line
    one_line(run_cli("compile", str(convnet_path), "-t", "llvm -mattr=+avx3", "-o", str(tmp_path / "o")), 5,
             "+avx3")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("shape, fragment", [
    ("input=-1x3x16x16", "dimension 0 is -1"),
    ("input=1x3x0x16", "dimension 2 is 0"),
    ("input=1x4x16x16", "dimension 1 is 3 in the model"),  # contradicts a static dimension
    ("input=1x3x16", "has 3 dimension"),
    ("input=1x3x?x16", "dimension 2 '?'"),
])
def test_bad_input_shapes_name_the_dimension(convnet_path: Path, tmp_path: Path, shape: str, fragment: str) -> None:
    one_line(run_cli("compile", str(convnet_path), "--input-shape", shape, "-o", str(tmp_path / "o")), 2, fragment)


def test_bracketed_shapes_are_accepted(convnet_path: Path, tmp_path: Path) -> None:
    proc = run_cli("compile", str(convnet_path), "--input-shape", "input=[2,3,16,16]", "-o", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr


def test_run_input_files(convnet_compiled: Path, tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# not an array\n")
    line = one_line(run_cli("run", str(convnet_compiled), "--input", f"input={readme}"), 9, "not a NumPy")
    assert "allow_pickle" not in line and "pickle" not in line.lower()
    np.save(tmp_path / "x.npy", np.zeros((2, 3, 16, 16), np.float32))
    one_line(run_cli("run", str(convnet_compiled), "--input", f"wrongname={tmp_path / 'x.npy'}"), 9,
             "no input named 'wrongname'", "its inputs are: input")


def test_bench_against_another_model(convnet_compiled: Path, tmp_path: Path) -> None:
    """Another model's inputs: one line (exit 9); the same inputs but other weights: outputs differ, exit 13."""
    other = tmp_path / "two.onnx"
    onnx.save(_two_inputs(), other)
    one_line(run_cli("bench", str(convnet_compiled), "--onnx", str(other), "--runs", "2", "--no-memory"), 9,
             "has inputs")
    reweighted = tmp_path / "reweighted.onnx"
    onnx.save(make_convnet(seed=5, batch=2), reweighted)
    proc = run_cli("bench", str(convnet_compiled), "--onnx", str(reweighted), "--runs", "2", "--no-memory")
    assert proc.returncode == 13 and "outputs       DIFFER" in proc.stdout, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "outputs differ from onnxruntime" in proc.stderr


def _two_inputs() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["c"])], "two",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 4]),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_inspect_check_imports_the_model(tmp_path: Path) -> None:
    """--check never says a model is fine that compile would then reject: it runs the real import."""
    # pads given at run time: every op is supported, the import still refuses them (a data-dependent Reshape was
    # the example until it imported: tests/unit/test_value_shapes.py)
    graph = helper.make_graph([helper.make_node("Cast", ["s"], ["s64"], to=TensorProto.INT64, name="cast"),
                               helper.make_node("Pad", ["x", "s64"], ["y"], name="run_time_pads")], "r",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                               helper.make_tensor_value_info("s", TensorProto.INT32, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    path = tmp_path / "r.onnx"
    onnx.save(model, path)
    proc = run_cli("inspect", str(path), "--check")
    one_line(proc, 4, "run_time_pads")
    assert "every operator is supported" not in proc.stdout


def test_short_passwords_are_refused(convnet_path: Path, tmp_path: Path) -> None:
    one_line(run_cli("compile", str(convnet_path), "-o", str(tmp_path / "o"), "--encrypt",
                     env={"FORGEKIT_ENCRYPT_PASSWORD": "short"}), 11, "at least 8")
    assert not (tmp_path / "o").exists()


def test_tuning_with_every_trial_invalid_is_an_error(convnet_path: Path) -> None:
    from forgekit.backends.cpu import fusion_passes
    from forgekit.targets import parse_target
    from forgekit.tuning.tuner import tune

    import tvm

    target = parse_target("host").tvm_target()
    with target:
        fused = tvm.transform.Sequential(fusion_passes(target))(forgekit.from_onnx(convnet_path).mod)

    def broken(*args: object, **kwargs: object) -> list[float]:
        raise RuntimeError("cannot run here")

    with pytest.raises(CompileError, match="all 2 trials were invalid .*cannot run here"):
        tune(fused, target, 2, [], measure=broken)


def test_stacked_calibration_on_a_dynamic_batch_counts_samples() -> None:
    ir = forgekit.from_onnx(make_convnet())  # batch N
    ir.calibrate(np.random.default_rng(0).standard_normal((5, 3, 16, 16)).astype(np.float32))
    assert ir.calibration.samples == 5


def test_inference_function_checks_inputs_like_the_runtime(convnet_path: Path) -> None:
    run = forgekit.from_onnx(convnet_path, {"input": [2, 3, 16, 16]}).get_inference_function("host", opt_level=1)
    with pytest.raises(InputError, match="dimension 2 must be 16"):
        run(np.zeros((2, 3, 15, 16), np.float32))
    with pytest.raises(InputError, match="4 dimensions"):
        run(np.zeros((2, 3, 16), np.float32))
    with pytest.raises(InputError, match="dtype float64"):
        run(np.zeros((2, 3, 16, 16)))
    assert run(np.zeros((2, 3, 16, 16), np.float32)).shape == (2, 10)


def test_debug_still_shows_the_traceback(tmp_path: Path) -> None:
    proc = run_cli("compile", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "o"), "--debug")
    assert proc.returncode != 0 and "Traceback" in proc.stderr
    assert os.environ.get("GITHUB_ACTIONS") != "true" or "::error::" in proc.stderr


def test_an_output_on_a_virtual_file_system_fails_before_the_compile(convnet_path: Path) -> None:
    """root "may write" /proc by its permission bits, but nothing can be created there: the compile ran to
    the end and only then failed to write.  A probe folder now fails it first (one line, no progress
    lines: the compile never started)."""
    if not Path("/proc/self").exists():
        pytest.skip("no /proc here")
    line = one_line(run_cli("compile", str(convnet_path), "-o", "/proc/forgekit-test-out"), 15,
                    "Cannot write '/proc/forgekit-test-out'", "takes no new folders")
    assert "Nothing was written" in line
