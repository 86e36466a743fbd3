"""A runtime ``If`` (the condition depends on an input) compiles both branches and picks one per call;
``freeze`` makes the input a constant so the ``If`` folds (forgekit/importer: TVM's If conversion,
prepare.py's freeze; runtime scalars through the inference function and the Engine)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import forgekit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import assert_close, ort_run  # noqa: E402
from onnx_models import runtime_if_model  # noqa: E402

RATES = (16000, 8000)


def _x(recurrent: bool) -> np.ndarray:
    shape = (9, 1, 4) if recurrent else (1, 3, 8, 8)
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("recurrent", [False, True], ids=["conv", "lstm_gru"])
@pytest.mark.parametrize("level", [0, 3])
def test_runtime_if_takes_either_branch(recurrent: bool, level: int) -> None:
    model = runtime_if_model(recurrent)
    run = forgekit.from_onnx(model).get_inference_function("host", opt_level=level)
    for rate in RATES:
        sr = np.array(rate, np.int64)  # a 0-d input: it used to reach the VM as shape (1,)
        assert_close(run(_x(recurrent), sr), ort_run(model, {model.graph.input[0].name: _x(recurrent), "sr": sr})[0])


@pytest.mark.parametrize("recurrent", [False, True], ids=["conv", "lstm_gru"])
def test_freeze_folds_the_if(recurrent: bool) -> None:
    model = runtime_if_model(recurrent)
    for rate in RATES:
        ir = forgekit.from_onnx(model, freeze={"sr": rate})
        assert ir.input_names == [model.graph.input[0].name] and "If" not in ir.mod.script()
        expected = ort_run(model, {model.graph.input[0].name: _x(recurrent), "sr": np.array(rate, np.int64)})[0]
        assert_close(ir.get_inference_function("host")(_x(recurrent)), expected)


def test_runtime_if_artifact_with_a_scalar_input(tmp_path: Path) -> None:
    model = runtime_if_model()
    forgekit.from_onnx(model).compile("host", output_path=tmp_path / "vad", opt_level=3)
    engine = forgekit.Engine(tmp_path / "vad")
    for rate in RATES:
        sr = np.array(rate, np.int64)
        assert_close(engine.infer(_x(False), sr)[0], ort_run(model, {"x": _x(False), "sr": sr})[0])


@pytest.mark.parametrize("frozen", [False, True], ids=["runtime_sr", "frozen_sr"])
def test_shape_ifs_and_computed_pads_inside_branches_fold(frozen: bool) -> None:
    """Silero VAD: a frozen ``sr`` inlines a branch that holds Ifs itself (was: the top-level If stayed
    and its branch's computed reflect Pad failed to import: "Dynamic pads are not supported"); with a
    runtime ``sr`` the branches are folded in place, so ``squeeze``'s If on a static ``shape[-1]`` and the
    pads computed from ``shape[1]`` fold although ``N`` stays symbolic."""
    from onnx_models import nested_shape_if_model

    model = nested_shape_if_model()
    for rate in RATES:
        ir = forgekit.from_onnx(model, freeze={"sr": rate} if frozen else None)
        run = ir.get_inference_function("host", opt_level=3)
        for n in (1, 3):
            x = np.random.default_rng(n).standard_normal((n, 4, 1)).astype(np.float32)
            sr = np.array(rate, np.int64)
            expected = ort_run(model, {"x": x, "sr": sr})[0]
            assert expected.shape == (n, 5)
            assert_close(run(x) if frozen else run(x, sr), expected)
