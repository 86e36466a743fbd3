"""Artifacts refuse to run where they cannot (forgekit/runtime/compat.py, runtime/cpu.py), checked on CPUs
that are not this one: qemu user-mode emulation of a Haswell (AVX2, no AVX-512) and a Nehalem (SSE4.2).

qemu emulates CPUID for the CPU model it is given, so forgekit's CPUID-based detection sees the emulated CPU;
/proc/cpuinfo would still describe this machine (which is why forgekit never reads it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import forgekit

QEMU = shutil.which("qemu-x86_64-static") or shutil.which("qemu-x86_64")
pytestmark = pytest.mark.skipif(QEMU is None or os.uname().machine != "x86_64",
                                reason="needs qemu-x86_64 (Debian package qemu-user-static) on an x86-64 machine")


def emulated(cpu: str, *args: str) -> subprocess.CompletedProcess:
    """``python -m forgekit ARGS`` on an emulated ``cpu`` (the venv's interpreter, run by qemu)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("GITHUB_ACTIONS", None)
    return subprocess.run([QEMU, "-cpu", cpu, sys.executable, "-m", "forgekit", *args], capture_output=True,
                          text=True, env=env, timeout=900)


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    # qemu warns about CPUID bits its TCG cannot emulate: that is qemu's stderr, not forgekit's
    return [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("qemu-x86_64")]


@pytest.fixture(scope="module")
def artifacts(convnet_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("compat")
    ir = forgekit.from_onnx(convnet_path, {"input": [2, 3, 16, 16]})
    out = {}
    for name, target in (("host", "host"), ("avx2", "x86/avx2"), ("portable", "llvm"), ("pi5", "raspberry-pi/5")):
        out[name] = ir.compile(target=target, output_path=root / name).path
    return out


def test_metadata_records_the_cpu_features(artifacts: dict[str, Path]) -> None:
    features = {k: json.loads((p / "metadata.json").read_text())["build"]["cpu_features"] for k, p in artifacts.items()}
    assert {"avx2", "fma"} <= set(features["avx2"]) and "avx512f" not in features["avx2"]
    assert features["portable"] == ["sse", "sse2"]
    assert {"neon", "dotprod"} <= set(features["pi5"])
    from forgekit.runtime.cpu import host_features

    if "avx512f" in host_features():
        assert "avx512f" in features["host"]


def test_avx512_artifact_refused_on_haswell_with_one_line(artifacts: dict[str, Path]) -> None:
    from forgekit.runtime.cpu import host_features

    if "avx512f" not in host_features():
        pytest.skip("this machine has no AVX-512: its host artifact runs on a Haswell")
    proc = emulated("Haswell", "run", str(artifacts["host"]), "--random", "--bench", "0")
    lines = error_lines(proc)
    assert proc.returncode == 16, proc.stderr
    assert len(lines) == 1 and "this CPU lacks" in lines[0] and "avx512f" in lines[0] and "x86/avx2" in lines[0], lines
    assert "Illegal instruction" not in proc.stderr and "Traceback" not in proc.stderr


def test_avx2_artifact_runs_on_haswell_and_is_refused_on_nehalem(artifacts: dict[str, Path]) -> None:
    ok = emulated("Haswell", "run", str(artifacts["avx2"]), "--random", "--bench", "0")
    assert ok.returncode == 0, ok.stderr
    assert "output" in ok.stdout or "probs" in ok.stdout
    old = emulated("Nehalem", "run", str(artifacts["avx2"]), "--random", "--bench", "0")
    assert old.returncode == 16 and "avx" in error_lines(old)[0], old.stderr
    portable = emulated("Nehalem", "run", str(artifacts["portable"]), "--random", "--bench", "0")
    assert portable.returncode == 0, portable.stderr


def test_foreign_architecture_says_so(artifacts: dict[str, Path]) -> None:
    proc = subprocess.run([sys.executable, "-m", "forgekit", "run", str(artifacts["pi5"]), "--random"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 16, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "aarch64 library" in lines[0] and "forgekit verify" in lines[0], lines
