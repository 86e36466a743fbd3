"""The forgekit GitHub Action: compile a model for each target, time it, optionally publish a release.

Inputs arrive only through the environment (``INPUT_MODEL``, ``INPUT_TARGETS``, ...) and reach the
``forgekit`` CLI as argv lists, never through a shell, so an input like ``1.0.0; rm -rf ~`` is just a bad
version string.  The CLI runs on the runner, or in a forgekit Docker image when the ``image`` input is set.
Results go to ``$GITHUB_OUTPUT`` (``artifact-path``, ``metadata-path``, ``library-sha256``, ``latency-ms``
of the first target; ``results``, ``artifacts``, ``archives`` as JSON lists; ``release-notes``,
``sha256sums``) and a markdown table (target, precision, size, latency, ops, fingerprint) to
``$GITHUB_STEP_SUMMARY``; each CLI call is a ``::group::`` in the log, and a failure becomes one
``::error file=MODEL::`` annotation with forgekit's own exit code.  This file uses only the standard
library: in image mode the runner needs nothing but Python 3 and Docker.
"""

from __future__ import annotations

import json
import os
import platform
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


def _forgekit(env: Mapping[str, str]) -> list[str]:
    """How to call the CLI: on this runner, or (input ``image``) in that Docker image.

    In the image the workspace is mounted at its own path and the current directory kept, so every path an
    input names means the same file inside and outside; the runner's UID writes the outputs.  Only the
    variables forgekit reads are forwarded, by name (``-e NAME``), so secrets never appear in argv.
    """
    image = get_input(env, "image")
    if not image:
        found = shutil.which("forgekit", path=env.get("PATH"))
        return [found] if found else [sys.executable, "-m", "forgekit"]
    cwd = os.getcwd()
    workspace = env.get("GITHUB_WORKSPACE") or cwd
    argv = ["docker", "run", "--rm", "--user", f"{os.getuid()}:{os.getgid()}", "-e", "HOME=/tmp",
            "-v", f"{workspace}:{workspace}", "-w", cwd]
    for name in _FORWARDED_ENV:
        if name in env:
            argv += ["-e", name]
    return [*argv, image]


#: Environment forgekit reads, forwarded into the image (values stay in the environment, not in argv).
_FORWARDED_ENV = ("FORGEKIT_ENCRYPT_PASSWORD", "SOURCE_DATE_EPOCH")


def _run(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), env=dict(env), capture_output=True, text=True)


def _step(title: str, argv: list[str], env: Mapping[str, str], runner: Runner) -> str:
    """Run one CLI call inside a log group; raise ActionFailed with forgekit's one-line error."""
    print(f"::group::{title}", flush=True)
    # The child must not annotate on its own: the action annotates once, with the model file.
    child_env = {k: v for k, v in env.items() if k != "GITHUB_ACTIONS"}
    proc = runner([*_forgekit(env), *argv], child_env)
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


def _compile_argv(env: Mapping[str, str], model: str, target: str, out: str) -> list[str]:
    """``forgekit compile`` for one target; every input becomes its own argv item (never shell text)."""
    argv = ["compile", model, "--target", target, "-o", out, "--force"]
    argv += [arg for shape in _list(get_input(env, "input-shape")) for arg in ("--input-shape", shape)]
    for name, flag in (("opt-level", "--opt-level"), ("quantize", "--quantize"), ("calib-data", "--calib-data"),
                       ("tune-trials", "--tune-trials"), ("records", "--records")):
        value = get_input(env, name)
        if value:
            argv += [flag, value]
    if _flag(env, "encrypt"):  # the password comes from FORGEKIT_ENCRYPT_PASSWORD (a secret), never from argv
        argv.append("--encrypt")
    return argv


def _runs_here(metadata: dict) -> bool:
    """Whether the artifact can be timed on this runner: a CPU artifact of this machine's architecture."""
    build = metadata["build"]
    return build["family"] not in ("cuda", "android") and build["arch"] == platform.machine()


def _latency(env: Mapping[str, str], out: str, runner: Runner) -> float | None:
    """Median latency (ms) from ``forgekit bench``; None when it cannot run here (a warning says why)."""
    runs = get_input(env, "bench-runs", "20") or "0"
    if runs == "0":
        return None
    report = str(Path(out).with_name(Path(out).name + ".bench.json"))
    try:
        _step(f"bench {Path(out).name}", ["bench", out, "--runs", runs, "--no-memory", "--json", report], env, runner)
    except ActionFailed as exc:  # e.g. an AVX-512 build on a runner without it: the compile still succeeded
        print(f"::warning::{escape_data('forgekit: latency not measured: ' + str(exc))}", flush=True)
        return None
    return float(json.loads(Path(report).read_text())["forgekit"]["median_ms"])


def _operators(env: Mapping[str, str], model: str, runner: Runner) -> int | None:
    """Number of operators in the model (``forgekit inspect --json``), for the summary."""
    try:
        info = json.loads(_step("inspect", ["inspect", model, "--json", "-"], env, runner))
    except (ActionFailed, ValueError):
        return None  # the compile step reports a broken model with the proper exit code
    return sum(info.get("operators", {}).values())


def _size(num: int) -> str:
    return f"{num / 1e6:.1f} MB" if num >= 1e5 else f"{num / 1e3:.1f} kB"


def runs_on(build: dict) -> str:
    """The CPU an artifact needs, in short (``x86_64 AVX-512``): the runner may not be the deployment machine.
    (This file runs on the bare runner, without forgekit: forgekit.runtime.cpu.describe_features says more.)"""
    features = set(build.get("cpu_features") or [])
    for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("dotprod", "NEON + dotprod"), ("neon", "NEON")):
        if flag in features:
            return f"{build.get('arch', '?')} {name}"
    return str(build.get("arch", "?"))


def _summary(rows: list[dict], ops: int | None, result: dict | None) -> str:
    """The job summary: one row per target, plus the published archive when there is a release."""
    bundles = {b["target"]: b for b in (result or {}).get("bundles", [])}
    head = "| target | runs on | precision | size | latency | ops | fingerprint |"
    lines = [head + (" archive |" if result else ""), "|---" * (8 if result else 7) + "|"]
    for row in rows:
        latency = f"{row['latency_ms']:.2f} ms" if row["latency_ms"] is not None else "not measured"
        line = (f"| {row['target']} | {row['runs_on']} | {row['precision']} | {_size(row['size'])} | {latency} | "
                f"{ops if ops is not None else '-'} | `{row['fingerprint'][:16]}` |")
        if result:
            bundle = bundles.get(row["target_name"])
            line += f" `{Path(bundle['archive']).name}` |" if bundle else " - |"
        lines.append(line)
    title = f"### forgekit: {result['model']} {result['version']}" if result else "### forgekit"
    return "\n".join([title, "", *lines]) + "\n"


def run_action(env: Mapping[str, str], runner: Runner = _run) -> dict[str, str]:
    """Compile each target (time it where it runs, publish when ``version`` is set); return the outputs.

    Per-target results go to the ``results`` output (JSON list); ``artifact-path``, ``metadata-path``,
    ``library-sha256`` and ``latency-ms`` describe the first target (a matrix job compiles one).
    """
    model = get_input(env, "model")
    if not model:
        raise ActionFailed("input 'model' is required", 2)
    # the portable x86-64 target by default: a release built on a CI runner must run on other CPUs ("host"
    # would build for the runner's own CPU, and its artifacts die with SIGILL on older ones)
    targets = _list(get_input(env, "targets", "x86-64")) or ["x86-64"]
    work = Path(get_input(env, "output-path", "forgekit-artifacts") or "forgekit-artifacts")
    version = get_input(env, "version")
    _flag(env, "encrypt")  # validate before the first (slow) step
    rows, artifacts = [], []
    for target in targets:
        out = str(work / target.replace("/", "-"))
        _step(f"compile {target}", _compile_argv(env, model, target, out), env, runner)
        metadata = json.loads((Path(out) / "metadata.json").read_text())
        latency = _latency(env, out, runner) if _runs_here(metadata) else None
        rows.append({"target": target, "target_name": metadata["build"]["target_name"], "artifact": out,
                     "metadata": str(Path(out) / "metadata.json"), "library": str(Path(out) / metadata["library"]["file"]),
                     "sha256": metadata["library"]["sha256"], "size": metadata["library"]["size"],
                     "precision": metadata["model"]["precision"], "fingerprint": metadata["model"]["fingerprint"],
                     "runs_on": runs_on(metadata["build"]), "latency_ms": latency})
        artifacts.append(out)
    first = rows[0]
    outputs = {"artifacts": json.dumps(artifacts), "results": json.dumps(rows),
               "artifact-path": first["artifact"], "metadata-path": first["metadata"],
               "library-sha256": first["sha256"],
               "latency-ms": "" if first["latency_ms"] is None else f"{first['latency_ms']:.3f}"}
    result = None
    if version:
        dist = get_input(env, "dist", "dist") or "dist"
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
            handle.write(_summary(rows, _operators(env, model, runner), result))
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
