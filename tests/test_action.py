"""The GitHub Action's entry code (action/main.py) under a fake ``GITHUB_*`` environment, with the real CLI."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from action.main import escape_data, escape_property, get_input, main  # noqa: E402


def _outputs(path: Path) -> dict[str, str]:
    """Parse ``$GITHUB_OUTPUT`` written in heredoc form (``name<<DELIM`` ... ``DELIM``)."""
    found, lines = {}, iter(path.read_text().splitlines())
    for line in lines:
        name, _, delimiter = line.partition("<<")
        value = []
        for body in lines:
            if body == delimiter:
                break
            value.append(body)
        found[name] = "\n".join(value)
    return found


def _env(tmp_path: Path, **inputs: str) -> dict[str, str]:
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "GITHUB_ACTIONS": "true",
           "GITHUB_OUTPUT": str(tmp_path / "gh_output"), "GITHUB_STEP_SUMMARY": str(tmp_path / "gh_summary"),
           "SOURCE_DATE_EPOCH": "1700000000"}
    # The runner's spelling: INPUT_ + upper-cased name, hyphens kept.
    env.update({f"INPUT_{k.upper()}": v for k, v in inputs.items()})
    return env


def test_compile_and_publish_writes_outputs_and_summary(convnet_path, tmp_path, capsys) -> None:
    env = _env(tmp_path, **{"MODEL": str(convnet_path), "TARGETS": "host", "INPUT-SHAPE": "input=2x3x16x16",
                            "VERSION": "v1.0.0", "OUTPUT": str(tmp_path / "dist"),
                            "ARTIFACTS-DIR": str(tmp_path / "arts")})
    assert main(env) == 0
    log = capsys.readouterr().out
    assert "::group::compile host\n" in log and "::group::publish v1.0.0\n" in log and log.count("::endgroup::") == 2
    outputs = _outputs(tmp_path / "gh_output")
    archive = tmp_path / "dist" / "convnet-1.0.0-host.tar.gz"
    assert json.loads(outputs["archives"]) == [str(archive)] and archive.is_file()
    assert json.loads(outputs["artifacts"]) == [str(tmp_path / "arts" / "host")]
    assert outputs["release-notes"] == str(tmp_path / "dist" / "RELEASE_NOTES.md")
    sha = (tmp_path / "dist" / "SHA256SUMS").read_text().split()[0]
    summary = (tmp_path / "gh_summary").read_text()
    assert summary.startswith("### forgekit: convnet 1.0.0\n")
    assert f"| host | `{tmp_path / 'arts' / 'host'}` | `convnet-1.0.0-host.tar.gz` | `{sha[:16]}…` |" in summary


def test_failure_is_one_error_annotation_with_the_model_file(tmp_path, capsys) -> None:
    missing = str(tmp_path / "no, such: model.onnx")
    env = _env(tmp_path, MODEL=missing, TARGETS="host", VERSION="1.0.0")
    assert main(env) == 3  # forgekit's exit code for a missing model
    errors = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("::error")]
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"::error file={escape_property(missing)}::forgekit: compile host: ")
    assert not (tmp_path / "gh_output").exists()


def test_inputs_never_reach_a_shell(convnet_path, tmp_path, capsys) -> None:
    marker = tmp_path / "PWNED"
    env = _env(tmp_path, MODEL=str(convnet_path), **{"INPUT-SHAPE": "input=2x3x16x16",
                                                      "VERSION": f"1.0.0; touch {marker}",
                                                      "ARTIFACTS-DIR": str(tmp_path / "arts"),
                                                      "OUTPUT": str(tmp_path / "dist")})
    assert main(env) == 2
    assert "is not semver-like" in capsys.readouterr().out
    assert not marker.exists() and not (tmp_path / "dist").exists()


def test_input_spelling_and_escaping() -> None:
    assert get_input({"INPUT_INCLUDE-KEY": " true "}, "include-key") == "true"
    assert get_input({"INPUT_INCLUDE_KEY": "true"}, "include-key") == "true"  # composite env spelling
    assert get_input({}, "targets", "host") == "host"
    assert escape_data("50%\nnext::x") == "50%25%0Anext::x"
    assert escape_property("a:b,c") == "a%3Ab%2Cc"


def test_action_yml_passes_every_input_through_env() -> None:
    text = (ROOT / "action.yml").read_text()
    inputs = re.findall(r"^  ([a-z][\w-]*):\n    description", text.split("\noutputs:")[0], flags=re.M)
    assert {"model", "targets", "version", "include-key", "encrypt"} <= set(inputs)
    for name in inputs:
        assert f"INPUT_{name.upper().replace('-', '_')}: ${{{{ inputs.{name} }}}}" in text
    for line in text.splitlines():
        if line.strip().startswith("run:"):
            assert "${{" not in line, f"expression pasted into shell text: {line}"
