"""Stage reports of a compile (forgekit/progress.py, build.py, backends/cpu/registry.py, artifact/writer.py)
and how the CLI shows them in a log (forgekit/cli/compile.py ``_stage``)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import forgekit
from forgekit import progress

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from onnx_models import line_recognizer  # noqa: E402


def test_a_compile_reports_its_stages_in_order(tmp_path: Path) -> None:
    seen: list[tuple[str, int | None, int | None]] = []
    ir = forgekit.from_onnx(line_recognizer(), {"x": [1, 8, 6, "W"]})
    with progress.listening(lambda *event: seen.append(event)):
        ir.compile("x86-64", output_path=tmp_path / "a", opt_level=3)
    stages = [s for s, _, _ in seen]
    assert stages[0] == "graph passes"
    assert "lowering for x86-64-v4 (1 of 3)" in stages and "lowering for x86-64-v2 (3 of 3)" in stages
    kernels = [(d, t) for s, d, t in seen if s == "scheduling kernels"]
    assert kernels and kernels[0][0] == 0 and all(d < t for d, t in kernels)
    assert stages[-1] == "linking model_library.so"
    progress.report("nobody listens")  # outside the block: no error, no output


def test_stage_lines_in_a_log_only_after_the_quiet_period(monkeypatch) -> None:
    from forgekit import log
    from forgekit.cli import compile as cli_compile

    out = io.StringIO()  # not a terminal: a CI log
    monkeypatch.setattr(log, "terminal", lambda: out)
    monkeypatch.setattr(cli_compile, "QUIET_SECONDS", 3600.0)
    with cli_compile._stage("compiling"):
        progress.report("graph passes")
    assert out.getvalue() == ""  # a quick step says nothing
    monkeypatch.setattr(cli_compile, "QUIET_SECONDS", 0.0)
    with cli_compile._stage("compiling"):
        progress.report("graph passes")
        progress.report("scheduling kernels", 0, 9)
        progress.report("scheduling kernels", 1, 9)  # the same stage: no second line
    assert out.getvalue().splitlines() == ["compiling: graph passes…", "compiling: scheduling kernels…"]
