"""The forgekit GitHub Action: compile a model for each target, then optionally publish a release.

Inputs arrive only through the environment (``INPUT_MODEL``, ``INPUT_TARGETS``, ...) and reach the
``forgekit`` CLI as argv lists, never through a shell, so an input like ``1.0.0; rm -rf ~`` is just a bad
version string.  Results go to ``$GITHUB_OUTPUT`` (``artifacts``, ``archives`` as JSON lists,
``release-notes``, ``sha256sums``) and a markdown table to ``$GITHUB_STEP_SUMMARY``; each CLI call is a
``::group::`` in the log, and a failure becomes one ``::error file=MODEL::`` annotation with forgekit's
own exit code.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Callable, Mapping, Sequence

Runner = Callable[[Sequence[str], Mapping[str, str]], subprocess.CompletedProcess]


class ActionFailed(Exception):
    """A step failed: ``code`` is the exit code to return, ``message`` the annotation."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def get_input(env: Mapping[str, str], name: str, default: str = "") -> str:
    """An action input: ``INPUT_<NAME>`` as the runner spells it (hyphens kept), or with underscores."""
    key = "INPUT_" + name.upper().replace(" ", "_")
    for candidate in (key, key.replace("-", "_")):
        if candidate in env:
            return env[candidate].strip()
    return default


def _flag(env: Mapping[str, str], name: str) -> bool:
    value = get_input(env, name, "false").lower()
    if value not in ("true", "false", ""):
        raise ActionFailed(f"input '{name}' must be true or false, not '{value}'", 2)
    return value == "true"


def _list(text: str) -> list[str]:
    """Targets and shapes may be given one per line or comma-separated."""
    return [item.strip() for line in text.splitlines() for item in line.split(",") if item.strip()]


def _forgekit() -> list[str]:
    found = shutil.which("forgekit")
    return [found] if found else [sys.executable, "-m", "forgekit"]


def _run(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), env=dict(env), capture_output=True, text=True)


def _step(title: str, argv: list[str], env: Mapping[str, str], runner: Runner) -> str:
    """Run one CLI call inside a log group; raise ActionFailed with forgekit's one-line error."""
    print(f"::group::{title}", flush=True)
    # The child must not annotate on its own: the action annotates once, with the model file.
    child_env = {k: v for k, v in env.items() if k != "GITHUB_ACTIONS"}
    proc = runner([*_forgekit(), *argv], child_env)
    sys.stdout.write(proc.stdout)
    sys.stdout.write(proc.stderr)
    print("::endgroup::", flush=True)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        message = lines[-1].removeprefix("error: ") if lines else f"forgekit exited with {proc.returncode}"
        raise ActionFailed(f"{title}: {message}", proc.returncode)
    return proc.stdout


def escape_data(value: str) -> str:
    """Workflow-command escaping of a message, so it cannot inject a second command on a new line."""
    return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(value: str) -> str:
    """Escaping of a property value (``file=``): also ``:`` and ``,``, which end a property."""
    return escape_data(value).replace(":", "%3A").replace(",", "%2C")


def _write_outputs(path: str | None, outputs: dict[str, str]) -> None:
    if not path:
        return
    with open(path, "a", encoding="utf-8") as handle:
        for name, value in outputs.items():
            delimiter = f"forgekit_{uuid.uuid4().hex}"  # heredoc form: values may hold any character
            handle.write(f"{name}<<{delimiter}\n{value}\n{delimiter}\n")


def _summary(targets: list[str], artifacts: list[str], result: dict | None) -> str:
    rows = ["| target | artifact | archive | sha256 |", "|---|---|---|---|"]
    bundles = {b["target"]: b for b in (result or {}).get("bundles", [])}
    for target, artifact in zip(targets, artifacts):
        metadata = json.loads((Path(artifact) / "metadata.json").read_text())
        bundle = bundles.get(metadata["build"]["target_name"])
        archive = f"`{Path(bundle['archive']).name}`" if bundle else "-"
        sha = f"`{bundle['sha256'][:16]}…`" if bundle else "-"
        rows.append(f"| {target} | `{artifact}` | {archive} | {sha} |")
    title = f"### forgekit: {result['model']} {result['version']}" if result else "### forgekit"
    return "\n".join([title, "", *rows]) + "\n"


def run_action(env: Mapping[str, str], runner: Runner = _run) -> dict[str, str]:
    """Compile (and publish when ``version`` is set); return the outputs written to ``$GITHUB_OUTPUT``."""
    model = get_input(env, "model")
    if not model:
        raise ActionFailed("input 'model' is required", 2)
    targets = _list(get_input(env, "targets", "host")) or ["host"]
    work = Path(get_input(env, "artifacts-dir", "forgekit-artifacts"))
    version = get_input(env, "version")
    encrypt = _flag(env, "encrypt")
    shapes = [arg for shape in _list(get_input(env, "input-shape")) for arg in ("--input-shape", shape)]
    artifacts = []
    for target in targets:
        out = str(work / target.replace("/", "-"))
        argv = ["compile", model, "--target", target, "-o", out, "--force", *shapes]
        if encrypt:  # the password comes from FORGEKIT_ENCRYPT_PASSWORD (a secret), never from argv
            argv.append("--encrypt")
        _step(f"compile {target}", argv, env, runner)
        artifacts.append(out)
    outputs = {"artifacts": json.dumps(artifacts)}
    result = None
    if version:
        dist = get_input(env, "output", "dist")
        report = work / "publish.json"
        argv = ["publish", *artifacts, "--version", version, "-o", dist, "--force", "--json", str(report)]
        argv += [arg for bench in _list(get_input(env, "bench")) for arg in ("--bench", bench)]
        if _flag(env, "include-key"):
            argv.append("--include-key")
        _step(f"publish {version}", argv, env, runner)
        result = json.loads(report.read_text())
        outputs.update({"archives": json.dumps([b["archive"] for b in result["bundles"]]),
                        "release-notes": result["release_notes"], "sha256sums": result["sha256sums"]})
    if env.get("GITHUB_STEP_SUMMARY"):
        with open(env["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as handle:
            handle.write(_summary(targets, artifacts, result))
    return outputs


def main(env: Mapping[str, str] | None = None, runner: Runner = _run) -> int:
    """Action entry point: 0 on success, else forgekit's exit code after one ``::error`` annotation."""
    env = os.environ if env is None else env
    try:
        outputs = run_action(env, runner)
    except ActionFailed as exc:
        model = get_input(env, "model")
        location = f" file={escape_property(model)}" if model else ""
        print(f"::error{location}::{escape_data('forgekit: ' + str(exc))}", flush=True)
        return exc.code
    _write_outputs(env.get("GITHUB_OUTPUT"), outputs)
    return 0
