"""Tuning (forgekit/tuning.py): measured knob search, records in the artifact and in a shared cache,
resume, reuse without search, and the CLI spellings (--tune-trials, LEIP --optimization)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import forgekit as forge
from conftest import assert_close, ort_run, run_cli
from forgekit.cli.compile import parse_optimization
from forgekit.errors import UsageError
from forgekit.runtime import Engine
from forgekit.tuning import ARTIFACT_RECORDS, Records
from test_backends_cpu import _conv_model


def _records(path) -> list[dict]:
    return Records(path).entries


@pytest.fixture(scope="module")
def model():
    return _conv_model(16, 32, 3, 1, 1, 14, pool="max")


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(3).standard_normal((1, 16, 14, 14)).astype(np.float32)


def test_tune_resume_and_reuse(model, x, tmp_path) -> None:
    expected = ort_run(model, {"x": x})[0]
    ir = forge.from_onnx(model)
    out, cache = tmp_path / "out", tmp_path / "cache"
    first = ir.compile(target="host", output_path=out, tuning_trials=5, records=cache, export_metadata=True)
    assert_close(Engine(first.path).infer(x)[0], expected)
    report = json.loads((out / "compile_report.json").read_text())
    assert report["tuning"]["trials"] == 5 and report["tuning"]["tasks"] >= 1
    assert "tuned" in report["schedule_rules"].values()
    own = _records(out / ARTIFACT_RECORDS)
    assert len(own) == 5 and all(e["seconds"] is None or min(e["seconds"]) > 0 for e in own)
    shared = [p for p in cache.iterdir() if p.is_dir()]
    assert len(shared) == 1 and len(_records(shared[0])) == 5  # one folder per target

    # N > 0 again: resumes from the artifact's records and adds N new settings, never a repeat.
    ir.compile(target="host", output_path=out, tuning_trials=3, records=cache, force_overwrite=True)
    own = _records(out / ARTIFACT_RECORDS)
    keys = [(e["workload"], json.dumps(e["knobs"], sort_keys=True)) for e in own]
    assert len(own) == 8 and len(set(keys)) == 8

    # N = 0: no search, the records are applied; outputs still match.
    again = ir.compile(target="host", output_path=tmp_path / "reuse", tuning_trials=0, records=cache,
                       export_metadata=True)
    report = json.loads((again.path / "compile_report.json").read_text())
    assert report["tuning"]["trials"] == 0 and report["tuning"]["records_used"] >= 1
    assert "tuned" in report["schedule_rules"].values()
    assert len(_records(again.path / ARTIFACT_RECORDS)) == 0
    assert_close(Engine(again.path).infer(x)[0], expected)


def test_shared_records_serve_another_model_with_the_same_kernels(model, x, tmp_path) -> None:
    """Workloads are keyed by structure, not weights or names: a second model reuses the first's records."""
    cache = tmp_path / "cache"
    forge.from_onnx(model).compile(target="host", output_path=tmp_path / "a", tuning_trials=3, records=cache)
    other = _conv_model(16, 32, 3, 1, 1, 14, pool="max")
    for init in other.graph.initializer:  # other weights, same shapes
        arr = np.frombuffer(init.raw_data, np.float32).copy() * 1.5 if init.raw_data else None
        if arr is not None:
            init.raw_data = arr.tobytes()
    result = forge.from_onnx(other).compile(target="host", output_path=tmp_path / "b", tuning_trials=0,
                                            records=cache, export_metadata=True)
    report = json.loads((result.path / "compile_report.json").read_text())
    assert "tuned" in report["schedule_rules"].values()
    assert_close(Engine(result.path).infer(x)[0], ort_run(other, {"x": x})[0])


def test_tuning_needs_a_scheduled_cpu_build(model, tmp_path) -> None:
    ir = forge.from_onnx(model)
    with pytest.raises(UsageError, match="opt_level 3 or 4"):
        ir.compile(target="host", output_path=tmp_path / "o2", opt_level=2, tuning_trials=2, records=False)
    with pytest.raises(UsageError, match="tuning_trials"):
        ir.compile(target="host", output_path=tmp_path / "neg", tuning_trials=-1, records=False)
    assert not (tmp_path / "o2").exists() and not (tmp_path / "neg").exists()


def test_parse_leip_optimization() -> None:
    assert parse_optimization(["category:graph,iterations:40"]) == {"iterations": 40}
    assert parse_optimization(["category:kernel,level:4", "category:graph,iterations:0"]) == {"level": 4, "iterations": 0}
    for bad in ["category:graph", "category:kernel,level:9", "iterations", "category:graph,iterations:-2"]:
        with pytest.raises(UsageError, match="--optimization"):
            parse_optimization([bad])


def test_cli_tune_and_bench(convnet_path, tmp_path) -> None:
    out = tmp_path / "art"
    done = run_cli("compile", str(convnet_path), "-o", str(out), "--input-shape", "input=1x3x16x16",
                   "--optimization", "category:graph,iterations:2", "--records", str(tmp_path / "cache"),
                   "--export-metadata")
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "compile_report.json").read_text())["tuning"]["trials"] == 2
    result_file = tmp_path / "bench.json"
    done = run_cli("bench", str(out), "--onnx", str(convnet_path), "--runs", "3", "--threads", "1",
                   "--json", str(result_file), "--markdown", str(tmp_path / "bench.md"))
    assert done.returncode == 0, done.stderr
    assert "ratio" in done.stdout and "onnxruntime" in done.stdout
    data = json.loads(result_file.read_text())
    assert data["outputs_match"] is True and data["threads"] == 1
    assert data["forgekit"]["runs"] == 3 and data["onnxruntime"]["runs"] == 3
    assert data["forgekit"]["peak_rss_mb"] > 0 and data["onnxruntime"]["peak_rss_mb"] > 0
    assert data["ratio"] == pytest.approx(data["forgekit"]["median_ms"] / data["onnxruntime"]["median_ms"])
    assert "| art |" in (tmp_path / "bench.md").read_text()
    bad = run_cli("bench", str(out), "--onnx", str(tmp_path / "missing.onnx"))
    assert bad.returncode == 3 and "does not exist" in bad.stderr and "Traceback" not in bad.stderr
