"""Peer runtimes timed next to forgekit (forgekit/evaluate/peers.py): OpenVINO at f32 and at its default
precision, in the same worker, on the same inputs and threads, its outputs judged against onnxruntime."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import run_cli

from forgekit.errors import UsageError
from forgekit.evaluate.bench import benchmark_artifact
from forgekit.evaluate.peers import check_peers


def test_openvino_is_timed_at_f32_and_its_default_precision(convnet_compiled: Path, convnet_path: Path) -> None:
    import openvino as ov

    result = benchmark_artifact(convnet_compiled, convnet_path, runs=5, warmup=1, threads=1, memory=False,
                                peers=["openvino"])
    assert "openvino-f32" in result.peers and result.peers["openvino-f32"].runs == 5
    f32 = result.peer_info["openvino-f32"]
    assert f32["precision"] == "f32" and f32["outputs_match"], f32  # like for like: it computes the same
    if "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        # OpenVINO's default on a bf16 CPU: bf16, close to (not equal to) onnxruntime
        bf16 = result.peer_info["openvino-bf16"]
        assert bf16["precision"] == "bf16" and 0 < bf16["max_abs_error"] < 0.02, bf16  # softmax outputs in [0, 1]
    data = result.to_dict()
    assert data["peer_ratios"]["openvino-f32"] == pytest.approx(result.forgekit.median_ms
                                                               / result.peers["openvino-f32"].median_ms)


def test_peer_names_and_their_needs_are_checked_in_one_line(convnet_compiled: Path) -> None:
    with pytest.raises(UsageError, match="Unknown peer runtime.*tensorrt.*choose from openvino"):
        check_peers(["openvino", "tensorrt"])
    assert check_peers(["openvino", "openvino"]) == ["openvino"]
    with pytest.raises(UsageError, match="give --onnx MODEL"):
        benchmark_artifact(convnet_compiled, None, runs=1, memory=False, peers=["openvino"])


def test_cli_prints_each_peer_and_the_ratio(convnet_compiled: Path, convnet_path: Path) -> None:
    proc = run_cli("bench", str(convnet_compiled), "--onnx", str(convnet_path), "--peer", "openvino", "--no-memory",
                   "-n", "3", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^openvino-f32 +median", proc.stdout, re.M) and "x its latency" in proc.stdout, proc.stdout
    bad = run_cli("bench", str(convnet_compiled), "--onnx", str(convnet_path), "--peer", "tvmc")
    assert bad.returncode == 2 and len([ln for ln in bad.stderr.splitlines() if ln.strip()]) == 1, bad.stderr


def test_each_runtime_peak_memory_is_probed_in_its_own_process(convnet_compiled: Path, convnet_path: Path) -> None:
    """forgekit, onnxruntime and every peer precision get a peak-RSS figure; a peer's figure is of a process that
    loaded that peer alone (OpenVINO at f32 and at its default precision each compile their own model)."""
    result = benchmark_artifact(convnet_compiled, convnet_path, runs=2, warmup=0, threads=1, memory=True,
                                peers=["openvino"])
    assert result.forgekit.peak_rss_mb > 0 and result.onnxruntime.peak_rss_mb > 0
    for label, timing in result.peers.items():
        assert timing.peak_rss_mb is not None and timing.peak_rss_mb > 20, (label, timing)
    proc = run_cli("bench", str(convnet_compiled), "--onnx", str(convnet_path), "--peer", "openvino", "-n", "2",
                   "--threads", "1")
    assert re.search(r"^openvino-f32 +median.*peak RSS \d+ MB", proc.stdout, re.M), proc.stdout
