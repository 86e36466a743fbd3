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


#: OpenBLAS's name for the core of each CPU model these tests emulate.  Some of our machines set
#: OPENBLAS_CORETYPE (and OPENBLAS_L2_SIZE) for their own CPU, and CI keeps the machine's environment: numpy's
#: OpenBLAS, told "Haswell" inside an emulated Nehalem, runs AVX2 kernels when numpy loads and dies with
#: SIGILL before forgekit runs.  The emulated process gets the emulated CPU's core instead (the rest of the
#: environment stays as the machine set it).
OPENBLAS_CORES = {"Haswell": "HASWELL", "Nehalem": "NEHALEM"}


def emulated_env(cpu: str, **extra: str) -> dict[str, str]:
    """This process's environment, with OpenBLAS's core set to the emulated ``cpu``'s (see OPENBLAS_CORES)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", **extra}
    env.pop("GITHUB_ACTIONS", None)
    if "OPENBLAS_CORETYPE" in env:
        env["OPENBLAS_CORETYPE"] = OPENBLAS_CORES[cpu]
    return env


def emulated(cpu: str, *args: str, **extra_env: str) -> subprocess.CompletedProcess:
    """``python -m forgekit ARGS`` on an emulated ``cpu`` (the venv's interpreter, run by qemu)."""
    return subprocess.run([QEMU, "-cpu", cpu, sys.executable, "-m", "forgekit", *args], capture_output=True,
                          text=True, env=emulated_env(cpu, **extra_env), timeout=900)


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
    # the portable target records its baseline level (x86-64-v2: SSE4.2) as what a CPU must have
    assert {"sse4.2", "popcnt"} <= set(features["portable"]) and "avx" not in features["portable"]
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


def test_one_portable_artifact_picks_the_best_level_each_cpu_has(artifacts: dict[str, Path], tmp_path: Path) -> None:
    """Bare ``llvm`` (like ``x86-64``) builds x86-64-v2/v3/v4 libraries into one artifact; each emulated CPU
    loads the best level it has, and every level computes the same outputs as this machine's choice."""
    import numpy as np

    from forgekit.runtime.cpu import host_features

    portable = artifacts["portable"]
    meta = json.loads((portable / "metadata.json").read_text())
    assert [v["name"] for v in meta["library"]["variants"]] == ["x86-64-v4", "x86-64-v3", "x86-64-v2"]
    native = subprocess.run([sys.executable, "-m", "forgekit", "run", str(portable), "--random", "--bench", "0",
                             "--save", str(tmp_path / "native.npz")], capture_output=True, text=True, timeout=300)
    assert native.returncode == 0, native.stderr
    if "avx512f" in host_features():
        assert "level: x86-64-v4 (model_library.x86-64-v4.so)" in native.stdout, native.stdout
    with np.load(tmp_path / "native.npz") as data:
        expected = {k: data[k] for k in data.files}
    for cpu, level in (("Haswell", "x86-64-v3"), ("Nehalem", "x86-64-v2")):
        proc = emulated(cpu, "run", str(portable), "--random", "--bench", "0", "--save", str(tmp_path / f"{cpu}.npz"))
        assert proc.returncode == 0, proc.stderr
        assert f"level: {level} (" in proc.stdout, proc.stdout
        with np.load(tmp_path / f"{cpu}.npz") as data:
            for name, want in expected.items():
                np.testing.assert_allclose(data[name], want, rtol=1e-5, atol=1e-5)


def test_forced_level_the_cpu_lacks_is_refused_with_one_line(artifacts: dict[str, Path]) -> None:
    proc = emulated("Haswell", "run", str(artifacts["portable"]), "--random", "--bench", "0",
                    FORGEKIT_LEVEL="x86-64-v4")
    lines = error_lines(proc)
    assert proc.returncode == 16 and len(lines) == 1 and "cannot run that level" in lines[0], proc.stderr
    assert "Illegal instruction" not in proc.stderr


def test_foreign_architecture_says_so(artifacts: dict[str, Path]) -> None:
    proc = subprocess.run([sys.executable, "-m", "forgekit", "run", str(artifacts["pi5"]), "--random"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 16, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "aarch64 library" in lines[0] and "forgekit verify" in lines[0], lines


def test_forgekits_own_emulated_processes_get_no_host_cpu_settings(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    """The product's side of the same trap: ``forgekit verify`` and RPC run guest processes under qemu
    (devices/qemu.py, rootfs.rootfs_command); their environment is built from scratch, so settings the host
    makes for its own CPU (OPENBLAS_CORETYPE=Haswell) never reach an emulated CPU's process."""
    from forgekit.devices.rootfs import guest, rootfs_command

    if os.geteuid() != 0:
        pytest.skip("the chroot command needs root")
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.setenv("OPENBLAS_L2_SIZE", "512")
    _, env = rootfs_command(tmp_path, guest("aarch64"), ["/usr/bin/python3", "-c", "pass"], {"PYTHONPATH": "/x"})
    assert not any(name.startswith("OPENBLAS") for name in env), env
    assert env["PYTHONPATH"] == "/x"
