"""The GitHub Action's entry code (action/main.py) under a fake ``GITHUB_*`` environment, with the real CLI."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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
                            "OPT-LEVEL": "2", "BENCH-RUNS": "3", "VERSION": "v1.0.0", "DIST": str(tmp_path / "dist"),
                            "OUTPUT-PATH": str(tmp_path / "arts")})
    assert main(env) == 0
    log = capsys.readouterr().out
    for group in ("compile host", "bench host", "publish v1.0.0", "inspect"):
        assert f"::group::{group}\n" in log
    assert log.count("::endgroup::") == 4
    outputs = _outputs(tmp_path / "gh_output")
    artifact = tmp_path / "arts" / "host"
    metadata = json.loads((artifact / "metadata.json").read_text())
    assert metadata["build"]["opt_level"] == 2  # the opt-level input reached forgekit compile
    assert outputs["artifact-path"] == str(artifact)
    assert outputs["metadata-path"] == str(artifact / "metadata.json")
    assert outputs["library-sha256"] == metadata["library"]["sha256"]
    assert 0 < float(outputs["latency-ms"]) < 10_000  # measured by forgekit bench on this machine
    [row] = json.loads(outputs["results"])
    assert row["precision"] == metadata["model"]["precision"] and row["size"] == metadata["library"]["size"]
    archive = tmp_path / "dist" / "convnet-1.0.0-host.tar.gz"
    assert json.loads(outputs["archives"]) == [str(archive)] and archive.is_file()
    assert json.loads(outputs["artifacts"]) == [str(artifact)]
    assert outputs["release-notes"] == str(tmp_path / "dist" / "RELEASE_NOTES.md")
    summary = (tmp_path / "gh_summary").read_text()
    assert summary.startswith("### forgekit: convnet 1.0.0\n")
    assert "| target | runs on | precision | size | latency | ops | fingerprint | archive |" in summary
    ops = sum(json.loads(_cli_json(convnet_path))["operators"].values())
    assert (f"| host | x86_64 " in summary and f" | {metadata['model']['precision']} | " in summary and f" ms | {ops} | "
            f"`{metadata['model']['fingerprint'][:16]}` | `convnet-1.0.0-host.tar.gz` |" in summary), summary


def _cli_json(model: Path) -> str:
    import subprocess

    return subprocess.run([sys.executable, "-m", "forgekit", "inspect", str(model), "--json", "-"], check=True,
                          capture_output=True, text=True).stdout


def test_every_compile_input_becomes_its_own_argv_item(tmp_path) -> None:
    """quantize/calib-data/tune-trials/records/opt-level reach forgekit compile as flags, values verbatim."""
    calls: list[list[str]] = []

    def fake_cli(argv, env):  # records the argv and fails like forgekit would, so nothing is compiled
        import subprocess

        calls.append(list(argv))
        return subprocess.CompletedProcess(argv, 2, "", "error: stop here\n")

    env = _env(tmp_path, **{"MODEL": "m.onnx", "TARGETS": "aarch64", "OPT-LEVEL": "1", "QUANTIZE": "int8",
                            "CALIB-DATA": "calib dir/$(x)", "TUNE-TRIALS": "64", "RECORDS": ".records",
                            "ENCRYPT": "true"})
    env["FORGEKIT_ENCRYPT_PASSWORD"] = "s3cret"
    assert main(env, runner=fake_cli) == 2
    argv = calls[0][calls[0].index("compile"):]
    assert argv == ["compile", "m.onnx", "--target", "aarch64", "-o", "forgekit-artifacts/aarch64", "--force",
                    "--opt-level", "1", "--quantize", "int8", "--calib-data", "calib dir/$(x)", "--tune-trials", "64",
                    "--records", ".records", "--encrypt"]
    assert "s3cret" not in " ".join(calls[0])


def test_image_input_runs_the_cli_in_docker_with_the_workspace_mounted(tmp_path, monkeypatch) -> None:
    calls: list[list[str]] = []

    def fake_cli(argv, env):
        import subprocess

        calls.append(list(argv))
        return subprocess.CompletedProcess(argv, 3, "", "error: model missing\n")

    monkeypatch.chdir(tmp_path)
    env = _env(tmp_path, MODEL="m.onnx", IMAGE="forgekit/cpu:0.1.0", ENCRYPT="true")
    env.update({"GITHUB_WORKSPACE": str(tmp_path), "FORGEKIT_ENCRYPT_PASSWORD": "s3cret"})
    assert main(env, runner=fake_cli) == 3
    argv = calls[0]
    assert argv[:3] == ["docker", "run", "--rm"]
    assert argv[argv.index("-v") + 1] == f"{tmp_path}:{tmp_path}" and argv[argv.index("-w") + 1] == str(tmp_path)
    assert argv[argv.index("forgekit/cpu:0.1.0") + 1:][:2] == ["compile", "m.onnx"]
    # The secret is forwarded by name only: its value stays in the environment.
    assert "FORGEKIT_ENCRYPT_PASSWORD" in argv and "s3cret" not in " ".join(argv)


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
                                                      "OUTPUT-PATH": str(tmp_path / "arts"),
                                                      "DIST": str(tmp_path / "dist")})
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
