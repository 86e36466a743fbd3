"""The output gate (forgekit/artifact/outputs.py): --force only ever replaces a forgekit output, and a write
that cannot happen is one line that leaves nothing behind.  Every refusal is checked for its exit code, its
one line, no traceback, and every file around it unchanged, byte for byte."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import forgekit
from conftest import run_cli
from forgekit.artifact.outputs import check_output, recognize
from forgekit.errors import OutputExistsError

SAMPLE = "sample:squeezenet"


def snapshot(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` with its sha256 (and every directory, with an empty hash)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        out[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
    return out


def one_line(proc: subprocess.CompletedProcess, code: int, *fragments: str) -> None:
    assert proc.returncode == code, proc.stderr + proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture
def workspace(tmp_path: Path, convnet_path: Path) -> Path:
    """A user's folder: their model, notes and a sub-folder, which no refused command may change."""
    ws = tmp_path / "ws"
    (ws / "docs").mkdir(parents=True)
    shutil.copy2(convnet_path, ws / "model.onnx")
    (ws / "notes.txt").write_text("precious\n")
    (ws / "docs" / "a.md").write_text("# a\n")
    return ws


@pytest.mark.parametrize("output, fragment", [
    ("", "empty"), (".", "current directory"), ("..", "above the current directory"), ("/", "root directory"),
])
def test_force_refuses_dangerous_paths(workspace: Path, output: str, fragment: str) -> None:
    before, parent = snapshot(workspace), snapshot(workspace.parent)
    one_line(run_cli("compile", "model.onnx", "-o", output, "--force", cwd=workspace), 8, fragment)
    assert snapshot(workspace) == before and snapshot(workspace.parent) == parent


def test_force_refuses_home(workspace: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".config").mkdir(parents=True)
    (home / ".bashrc").write_text("export X=1\n")
    before = snapshot(home)
    one_line(run_cli("compile", str(workspace / "model.onnx"), "-o", str(home), "--force", cwd=workspace,
                     env={"HOME": str(home)}), 8, "home directory")
    assert snapshot(home) == before


def test_force_refuses_the_folder_holding_an_input(workspace: Path) -> None:
    before = snapshot(workspace)
    one_line(run_cli("compile", str(workspace / "model.onnx"), "-o", str(workspace), "--force"), 8,
             "holds the input")
    assert snapshot(workspace) == before


def test_force_refuses_a_folder_that_is_not_a_forgekit_output(workspace: Path) -> None:
    before = snapshot(workspace)
    one_line(run_cli("compile", str(workspace / "model.onnx"), "-o", str(workspace / "docs"), "--force"), 8,
             "not a forgekit artifact", "never replaces")
    assert snapshot(workspace) == before


def test_force_replaces_a_forgekit_artifact(workspace: Path) -> None:
    out = workspace / "out"
    assert run_cli("compile", str(workspace / "model.onnx"), "-o", str(out)).returncode == 0
    assert recognize(out) == "artifact"
    one_line(run_cli("compile", str(workspace / "model.onnx"), "-o", str(out)), 8, "--force")
    assert run_cli("compile", str(workspace / "model.onnx"), "-o", str(out), "--force").returncode == 0
    assert sorted(p.name for p in workspace.iterdir()) == ["docs", "model.onnx", "notes.txt", "out"]


def test_python_api_refuses_like_the_cli(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ir = forgekit.from_onnx(workspace / "model.onnx")
    before = snapshot(workspace)
    monkeypatch.chdir(workspace)
    for path in (".", "", workspace, workspace / "docs"):
        with pytest.raises(OutputExistsError):
            ir.compile(target="host", output_path=path, force_overwrite=True)
    assert snapshot(workspace) == before


def test_publish_and_decrypt_refuse_foreign_folders(workspace: Path, tmp_path: Path) -> None:
    art = tmp_path / "art"
    env = {"FORGEKIT_ENCRYPT_PASSWORD": "a long enough password"}
    assert run_cli("compile", str(workspace / "model.onnx"), "-o", str(art), "--encrypt", env=env).returncode == 0
    before = snapshot(workspace)
    one_line(run_cli("publish", str(art), "--version", "1.0.0", "-o", str(workspace), "--force"), 8,
             "not a forgekit release folder")
    one_line(run_cli("publish", str(art), "--version", "1.0.0", "-o", str(art), "--force"), 8, "holds the input")
    one_line(run_cli("decrypt", str(art), "-o", str(workspace / "docs"), "--force", env=env), 8,
             "not a forgekit artifact")
    one_line(run_cli("decrypt", str(art), "-o", ".", "--force", cwd=workspace, env=env), 8, "current directory")
    one_line(run_cli("images", "wheelhouse", ".", "--force", cwd=workspace), 8, "current directory")
    assert snapshot(workspace) == before
    dist = tmp_path / "dist"
    assert run_cli("publish", str(art), "--version", "1.0.0", "-o", str(dist)).returncode == 0
    assert recognize(dist) == "dist"
    assert run_cli("publish", str(art), "--version", "1.0.1", "-o", str(dist), "--force").returncode == 0


def test_check_output_kinds(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "a.whl").write_bytes(b"")
    assert recognize(tmp_path / "w") == "wheelhouse"
    with pytest.raises(OutputExistsError, match="holds a forgekit wheelhouse, not a forgekit artifact"):
        check_output(tmp_path / "w", force=True, kind="artifact")
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputExistsError, match="is a file"):
        check_output(tmp_path / "file", force=True)
    assert check_output(tmp_path / "new" / "deeper", force=False) == tmp_path / "new" / "deeper"


def test_unwritable_output_is_one_line_and_leaves_nothing(workspace: Path) -> None:
    one_line(run_cli("compile", str(workspace / "model.onnx"), "-o", "/proc/forgekit-out"), 15, "Cannot write")
    assert not Path("/proc/forgekit-out").exists()


def _mount_tmpfs(path: Path, options: str) -> bool:
    path.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True).returncode == 0


def _umount(path: Path) -> None:
    subprocess.run(["umount", str(path)], capture_output=True)


def test_read_only_and_full_disks(workspace: Path, tmp_path: Path) -> None:
    ro, small = tmp_path / "ro", tmp_path / "small"
    if not (_mount_tmpfs(ro, "ro,size=1m") and _mount_tmpfs(small, "size=64k")):
        _umount(ro)
        pytest.skip("needs root to mount a read-only and a tiny tmpfs")
    try:
        one_line(run_cli("compile", str(workspace / "model.onnx"), "-o", str(ro / "out")), 15, "Read-only file system")
        full = run_cli("compile", str(workspace / "model.onnx"), "-o", str(small / "out"), env={"TMPDIR": str(small)})
        one_line(full, 15, "No space left on device")
        assert list(small.iterdir()) == [] and list(ro.iterdir()) == []  # nothing half-written, no temp dirs
    finally:
        _umount(ro)
        _umount(small)


def test_a_pseudo_file_system_is_not_called_full() -> None:
    """/proc has no blocks to count (statvfs: 0 free of 0): the space check called it "No space left on device
    (0 MiB free in /proc)" (red-team); it leaves such a folder to the write, whose own reason is the line."""
    from forgekit.artifact.outputs import check_space

    check_space(Path("/proc/forgekit-output"), 10 << 20)  # no OutputWriteError


def test_a_wrong_input_shape_name_names_the_cli_option(workspace: Path) -> None:
    proc = run_cli("compile", str(workspace / "model.onnx"), "-o", str(workspace / "o"), "--input-shape",
                   "wrongname=1x3x8x8")
    one_line(proc, 2, "--input-shape", "wrongname")
