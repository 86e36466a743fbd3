"""The README as a new user meets it: its "compile your own model" commands work as written, and every
verb's ``--help`` fits an 80-column terminal with every option name whole."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import forgekit_bin, run_cli

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- tests/unit/test_readme.py runs the commands of this block"


def own_model_commands() -> list[str]:
    """The shell lines of the README block under :data:`MARKER`."""
    text = (ROOT / "README.md").read_text()
    assert MARKER in text, "the README lost its 'compile your own model' block (or its marker)"
    rest = text[text.index(MARKER):]
    start = rest.index("```sh\n") + len("```sh\n")
    return [line for line in rest[start:rest.index("```", start)].splitlines() if line.strip()]


def test_readme_compile_your_own_model_commands_work_as_written(tmp_path):
    from forgekit.samples import sample_path

    commands = own_model_commands()
    assert [c.split()[1] for c in commands] == ["inspect", "compile", "verify", "bench"]
    shutil.copy(sample_path("squeezenet"), tmp_path / "model.onnx")  # a model from the onnx wheel
    env = {**os.environ, "PATH": f"{Path(forgekit_bin()).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("GITHUB_ACTIONS", None)
    for command in commands:
        done = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=900)
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr
    assert (tmp_path / "out" / "model_library.so").is_file() and (tmp_path / "out" / "metadata.json").is_file()
    assert "every operator is supported" in subprocess.run(commands[0], shell=True, cwd=tmp_path, env=env,
                                                           capture_output=True, text=True).stdout


def _verbs() -> dict[str, list[str]]:
    """verb (or 'group verb') -> its option names, from the CLI's own click command tree."""
    import typer

    import forgekit.cli  # noqa: F401 - registers every verb
    from forgekit.cli.app import app

    verbs: dict[str, list[str]] = {}

    def walk(command, prefix: list[str]) -> None:
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                walk(sub, prefix + [name])
        verbs[" ".join(prefix)] = [opt for p in command.params if not getattr(p, "hidden", False)
                                   for opt in (*p.opts, *p.secondary_opts)
                                   if opt.startswith("-")]

    walk(typer.main.get_command(app), [])
    return verbs


@pytest.mark.parametrize("verb", sorted(_verbs()), ids=lambda v: v or "forgekit")
def test_help_fits_80_columns_with_every_option_whole(verb):
    done = run_cli(*verb.split(), "--help", env={"COLUMNS": "80", "TERM": "xterm-256color"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    words = set(re.findall(r"--?[A-Za-z][\w-]*", done.stdout))
    missing = [opt for opt in _verbs()[verb] if opt not in words]
    assert not missing, f"'forgekit {verb} --help' at 80 columns cuts or hides {missing}:\n{done.stdout}"
    assert "…" not in done.stdout


def test_every_relative_link_in_the_docs_resolves():
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken
