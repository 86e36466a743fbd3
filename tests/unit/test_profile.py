"""Per-kernel profiles of compiled artifacts (forgekit/evaluate/profile.py, ``forgekit bench --profile``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_convnet, run_cli

import forgekit
from forgekit.evaluate.bench import benchmark_artifact
from forgekit.evaluate.profile import profile_engine, table
from forgekit.runtime import Engine


@pytest.fixture(scope="module")
def reported(convnet_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("profile") / "art"
    forgekit.from_onnx(convnet_path, {"input": [2, 3, 16, 16]}).compile(target="host", output_path=out,
                                                                         export_metadata=True)
    return out


def test_every_kernel_is_timed_with_its_rule_and_gflops(reported: Path) -> None:
    engine = Engine(reported)
    x = engine.example_inputs()
    rows = profile_engine(engine, x, runs=5, report_dir=reported)
    names = [r.name for r in rows]
    conv = next(r for r in rows if r.name.startswith("fused_conv2d"))
    assert conv.calls == 1 and conv.rule == "conv2d" and conv.gflops and conv.gflops > 0
    assert any(n.startswith("vm.builtin") for n in names)  # the runtime's own calls are counted too
    assert sum(r.share for r in rows) == pytest.approx(1.0)
    assert [r.ms for r in rows] == sorted((r.ms for r in rows), reverse=True)
    assert "GFLOP/s" in table(rows, top=3).splitlines()[0] and "more" in table(rows, top=3).splitlines()[-1]
    engine.infer(*x)  # the hook is gone: plain runs work as before


def test_without_a_compile_report_there_is_no_gflops(convnet_compiled: Path) -> None:
    engine = Engine(convnet_compiled)
    rows = profile_engine(engine, engine.example_inputs(), runs=2, report_dir=convnet_compiled)
    assert rows and all(r.gflops is None and r.rule is None for r in rows)


def test_bench_profile_in_the_library_and_the_cli(reported: Path) -> None:
    result = benchmark_artifact(reported, runs=3, warmup=1, threads=1, memory=False, profile=True)
    assert any(k["rule"] == "conv2d" for k in result.extra["profile"])
    proc = run_cli("bench", str(reported), "--profile", "--no-memory", "-n", "3", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    assert "kernels (instrumented runs, per inference):" in proc.stdout and "fused_conv2d" in proc.stdout


def test_a_portable_int8_artifact_profiles_the_level_this_cpu_loads(tmp_path, monkeypatch) -> None:
    """The compile report held the first level's kernels only (x86-64-v4-vnni: fused_conv2d_int8_*): a CPU
    without VNNI runs x86-64-v3's fused_conv2d_* kernels, and bench --profile left their GFLOP/s and rule
    blank."""
    import numpy as np

    rng = np.random.default_rng(0)
    ir = forgekit.from_onnx(make_convnet(), {"input": [1, 3, 16, 16]})
    ir.calibrate([rng.standard_normal((1, 3, 16, 16)).astype(np.float32) for _ in range(4)])
    ir.quantize()
    ir.compile(output_path=tmp_path / "a", export_metadata=True)
    monkeypatch.setenv("FORGEKIT_LEVEL", "x86-64-v3")
    engine = Engine(tmp_path / "a")
    rows = profile_engine(engine, engine.example_inputs(), runs=2, report_dir=tmp_path / "a")
    convs = [r for r in rows if r.name.startswith("fused_conv2d")]
    assert engine.level == "x86-64-v3" and convs
    assert all(r.rule and r.gflops for r in convs), [(r.name, r.rule, r.gflops) for r in convs]
