"""The one gate every output directory passes: what forgekit may replace, and how it writes.

forgekit writes a whole directory (an artifact, a release's DIST folder, a wheelhouse) into a temporary
sibling and renames it into place, so a failure never leaves half an output.  ``force`` replaces an
existing output, and that is where a tool can destroy what it was never given: ``-o "$OUT" --force``
with an unset ``OUT`` is ``-o "" --force``, the current directory.  So ``force`` only ever replaces
a directory that forgekit itself wrote, recognised by its own files (:func:`recognize`), and never:

* an empty path, ``/``, the current directory or any folder above it, ``$HOME`` or any folder above it;
* a folder that holds one of the command's inputs (the model, calibration data, a key file...);
* a non-empty folder that is not a forgekit output of the same kind.

Each refusal is one :class:`~forgekit.errors.OutputExistsError` line (exit 8) and touches nothing.
A write that fails for lack of permission or space is one :class:`~forgekit.errors.OutputWriteError`
line (exit 15) and leaves nothing behind, not even the parent folders it created.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

from ..errors import OutputExistsError, OutputWriteError

#: output kinds, by what a user calls them in messages
KINDS = {"artifact": "forgekit artifact", "dist": "forgekit release folder", "wheelhouse": "forgekit wheelhouse"}
#: errno values that mean "this location cannot be written", reported as one OutputWriteError line
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EFBIG, errno.ENOTDIR,
                 errno.ENOENT, errno.EEXIST}


def recognize(path: Path) -> str | None:
    """Which forgekit output ``path`` is (``artifact``, ``dist``, ``wheelhouse``), by its own files."""
    try:
        entries = [e for e in path.iterdir()]
    except OSError:
        return None
    names = {e.name for e in entries}
    if "metadata.json" in names:
        try:
            schema = json.loads((path / "metadata.json").read_text()).get("schema", "")
        except (OSError, ValueError, AttributeError):
            schema = ""
        if str(schema).startswith("forgekit.artifact/"):
            return "artifact"
    if {"RELEASE_NOTES.md", "SHA256SUMS"} <= names and all(
            n in ("RELEASE_NOTES.md", "SHA256SUMS") or n.endswith(".tar.gz") for n in names):
        return "dist"
    if names and all(n.endswith(".whl") for n in names):
        return "wheelhouse"
    return None


def _inside(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def check_output(path: str | os.PathLike[str], *, force: bool, kind: str = "artifact",
                 inputs: Iterable[str | os.PathLike[str] | None] = ()) -> Path:
    """Refuse (one line, nothing touched) unless ``path`` may become a ``kind`` output; returns it absolute.

    ``inputs`` are the files and folders the command reads: an output that holds one is refused.
    """
    if not str(path).strip():
        raise OutputExistsError("The output path is empty (an unset variable in -o \"$OUT\"?): give a directory "
                                "such as ./out.")
    out = Path(path).expanduser().absolute()
    real = out.resolve()
    what = KINDS.get(kind, kind)
    if real == Path(real.anchor):
        raise OutputExistsError(f"Refusing to write a {what} to '{path}': it is the root directory.")
    cwd = Path.cwd().resolve()
    if _inside(cwd, real):
        here = "the current directory" if cwd == real else "a folder above the current directory"
        raise OutputExistsError(f"Refusing to write a {what} to '{path}': it is {here}. Give a new folder, "
                                "e.g. -o ./out.")
    home = Path.home().resolve()
    if _inside(home, real):
        raise OutputExistsError(f"Refusing to write a {what} to '{path}': it is your home directory or above it. "
                                "Give a new folder, e.g. -o ./out.")
    for item in inputs:
        if item is None or not str(item):
            continue
        source = Path(item).expanduser().absolute().resolve()
        if _inside(source, real):
            raise OutputExistsError(f"Refusing to write a {what} to '{path}': it holds the input '{item}'. "
                                    "Choose an output folder outside the inputs.")
    if out.is_symlink() and not out.is_dir():
        raise OutputExistsError(f"Output path '{path}' is a link to a file: choose a directory path.")
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"Output path '{path}' is a file: choose a directory path.")
    if out.is_dir() and any(out.iterdir()):
        found = recognize(out)
        if found is None:
            raise OutputExistsError(f"Output directory '{path}' is not empty and is not a {what}: forgekit never "
                                    "replaces it, even with --force. Choose a new or empty folder.")
        if found != kind:
            raise OutputExistsError(f"Output directory '{path}' holds a {KINDS[found]}, not a {what}: choose "
                                    "another folder.")
        if not force:
            raise OutputExistsError(f"Output directory '{path}' already exists: pass --force (force_overwrite=True) "
                                    "to replace it, or choose another path.")
    _check_writable(out)
    return out


def _check_writable(out: Path) -> None:
    """Fail before any work when the folder the output goes into cannot be written (no permission, read-only)."""
    probe = out.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not os.access(probe, os.W_OK | os.X_OK):
        code = errno.EROFS if _read_only(probe) else errno.EACCES
        raise write_error(out, OSError(code, os.strerror(code))) from None
    # permission bits are not the whole story: root may "access" /proc or /sys, where creating anything fails
    # (-o /proc/x failed only after the whole compile).  The writer makes its staging folder here too.
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".forgekit-probe-", dir=probe))
    except OSError as exc:
        raise write_error(out, OSError(exc.errno, f"'{probe}' takes no new folders ({exc.strerror})")) from None


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def write_error(path: Path, exc: OSError) -> OutputWriteError:
    """One line for an OSError met while writing ``path`` (permissions, read-only, disk full)."""
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = "free some space"
    elif os.path.exists("/.dockerenv") and exc.errno in (errno.EACCES, errno.EPERM):
        hint = ("in a container the mounted folder's owner must match the user: run without --user, or with "
                "--user \"$(id -u):$(id -g)\"")
    else:
        hint = "choose a folder you can write"
    return OutputWriteError(f"Cannot write '{path}': {reason}. Nothing was written; {hint}.")


def _make_parents(parent: Path) -> list[Path]:
    """Create ``parent`` and the folders above it that are missing; returns the ones created (deepest first)."""
    created = []
    probe = parent
    while not probe.exists():
        created.append(probe)
        probe = probe.parent
    parent.mkdir(parents=True, exist_ok=True)
    return created


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str], force: bool, *, kind: str = "artifact",
                     inputs: Iterable[str | os.PathLike[str] | None] = ()) -> Iterator[Path]:
    """Yield a temporary directory next to ``path``; on success it replaces ``path``, else it is removed.

    Every check of :func:`check_output` runs first (and again just before the rename, in case the folder
    appeared meanwhile); OSErrors of writing become one-line :class:`OutputWriteError` s.
    """
    inputs = list(inputs)
    out = check_output(path, force=force, kind=kind, inputs=inputs)
    created: list[Path] = []
    tmp: Path | None = None
    done = False
    try:
        try:
            created = _make_parents(out.parent)
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
        except OSError as exc:
            raise write_error(out, exc) from None
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the output should look like any mkdir
        try:
            yield tmp
        except OSError as exc:
            if exc.errno in _WRITE_ERRNOS:
                raise write_error(out, exc) from None
            raise
        check_output(out, force=force, kind=kind, inputs=inputs)
        try:
            if out.exists():
                trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
                os.replace(out, trash / "old")
                os.replace(tmp, out)
                shutil.rmtree(trash, ignore_errors=True)
            else:
                os.replace(tmp, out)
        except OSError as exc:
            raise write_error(out, exc) from None
        done = True
    finally:
        if not done:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            for folder in created:  # deepest first; only the ones this call made, and only if still empty
                with contextlib.suppress(OSError):
                    folder.rmdir()


#: what a link needs besides the weights: object files, the linked code, the metadata (measured: a few MB)
SPACE_MARGIN = 32 << 20


def check_space(output: Path, weight_bytes: int) -> None:
    """Refuse, before a long build, when the disks cannot hold it: the linker writes the weights twice into
    ``$TMPDIR`` (object file, then library) and the library once more next to the output.  An LLVM or linker
    that runs out of space mid-way exits the whole process ("LLVM ERROR: IO failure on output stream"),
    leaving its temporary files: this check is what keeps a full disk a one-line error."""
    probe = output.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    needs: dict[int, tuple[int, Path]] = {}
    for path, size in ((Path(tempfile.gettempdir()), 2 * weight_bytes), (probe, weight_bytes)):
        try:
            device = os.stat(path).st_dev
        except OSError:
            continue
        total, where = needs.get(device, (0, path))
        needs[device] = (total + size + SPACE_MARGIN, where)
    for total, where in needs.values():
        stats = os.statvfs(where)
        if stats.f_blocks == 0:  # /proc, /sys: no blocks to count; writing there fails with its own reason
            continue
        free = stats.f_bavail * stats.f_frsize
        if free < total:
            raise write_error(output, OSError(errno.ENOSPC, f"No space left on device ({free >> 20} MiB free in "
                                                            f"{where}, about {total >> 20} MiB needed)"))
