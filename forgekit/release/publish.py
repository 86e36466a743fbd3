"""``publish``: compiled artifacts → versioned, bit-reproducible release archives, one per target.

``DIST/<model>-<version>-<target>.tar.gz`` holds one top-level directory ``<model>-<version>-<target>/``
with ``model_library.so``, ``metadata.json``, ``compile_report.json`` and ``bench.json`` when the artifact
has them, ``modelKey.bin`` only with ``include_key``, a rendered ``MODEL_CARD.md`` and
``RELEASE_NOTES.md``, and ``SHA256SUMS`` over all of them.  ``DIST`` also gets ``RELEASE_NOTES.md`` and a
``SHA256SUMS`` of the archives (what a release page uploads).

Identical inputs give identical bytes: archive timestamps and the notes' date come from
``SOURCE_DATE_EPOCH`` or, when it is unset, from the newest artifact's ``created`` time, never the clock;
nothing depends on the output path.  The whole ``DIST`` is written into a temporary sibling and renamed
into place, so a failure never leaves a half-written release.

Latency is only ever copied from a ``forgekit bench --json`` result (``bench=``, or ``bench.json`` inside
the artifact); without one the card says "not measured".  ``include_key`` with no encrypted artifact is an
error (a pipeline that believes it ships a key should stop); for a mix, plain artifacts are published
without a key and a note says so.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..artifact import metadata as md
from ..artifact.layout import (BENCH_FILE, KEY_FILE, LIBRARY_FILE, METADATA_FILE, REPORT_FILE, artifact_dir,
                               library_digests, library_files,
                               file_digest, read_metadata)
from ..artifact.outputs import atomic_directory
from ..errors import ArtifactError, UsageError
from .archive import SECRET_MODE, Member, write_reproducible_tar_gz
from .chart import CHART_FILE, latency_svg
from .device_runtime import README_FILE, cuda_readme, device_commands, is_cuda, runtime_members
from .model_card import card_context, release_context

CARD_FILE = "MODEL_CARD.md"
NOTES_FILE = "RELEASE_NOTES.md"
SUMS_FILE = "SHA256SUMS"

# Semantic version (an optional leading "v", as in git tags, is dropped).
_SEMVER = re.compile(r"^v?(?P<v>(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
                     r"(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?)$")


@dataclass
class Bundle:
    """One published archive."""

    target: str
    archive: Path
    sha256: str
    size: int
    members: list[str]
    key_included: bool
    latency_measured: bool


@dataclass
class PublishResult:
    """What :func:`publish` wrote: the archives, the release-level notes and checksum files."""

    output: Path
    model: str
    version: str
    bundles: list[Bundle]
    release_notes: Path
    sha256sums: Path
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (paths as strings), as written by ``forgekit publish --json``."""
        return {"output": str(self.output), "model": self.model, "version": self.version,
                "release_notes": str(self.release_notes), "sha256sums": str(self.sha256sums), "notes": self.notes,
                "bundles": [{**b.__dict__, "archive": str(b.archive)} for b in self.bundles]}


@dataclass
class _Artifact:
    path: Path
    meta: dict[str, Any]
    target: str
    bench: dict[str, Any] | None = None
    bench_source: Path | None = None


def sanitize(text: str) -> str:
    """A file-name-safe form: runs of characters outside ``[A-Za-z0-9._-]`` (and of ``-``) become one ``-``."""
    return re.sub(r"-{2,}", "-", re.sub(r"[^A-Za-z0-9._-]+", "-", text)).strip("-._")


def parse_version(version: str) -> str:
    """Check that ``version`` is semver-like (``1.2.3``, ``v1.2.3-rc.1``); return it without the ``v``."""
    match = _SEMVER.match(version.strip())
    if not match:
        raise UsageError(f"Version '{version}' is not semver-like: use MAJOR.MINOR.PATCH, e.g. 1.2.0 or 1.2.0-rc.1.")
    return match.group("v")


def _load_artifact(path: Path) -> _Artifact:
    artifact_dir(path)
    try:
        meta = read_metadata(path)
        target = str(meta["build"]["target_name"])
        digests = {**library_digests(meta), LIBRARY_FILE: meta["library"]["sha256"]}  # the baseline's is required
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ArtifactError(f"'{path / METADATA_FILE}' is not valid forgekit metadata ({exc!r}).") from None
    # A release must ship exactly what was compiled: refuse a library changed since metadata.json was written.
    for name, sha in digests.items():
        if not (path / name).is_file() or file_digest(path / name)[0] != sha:
            raise ArtifactError(f"'{path / name}' does not match the sha256 in its metadata.json: "
                                "the artifact was modified after compiling.")
    return _Artifact(path, meta, target)


def _read_bench(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        float(data["forgekit"]["median_ms"])
    except FileNotFoundError:
        raise UsageError(f"Bench file '{path}' does not exist.") from None
    except (ValueError, KeyError, TypeError):
        raise UsageError(f"'{path}' is not a 'forgekit bench --json' result (no forgekit.median_ms).") from None
    return data


def _attach_bench(artifacts: list[_Artifact], bench: Iterable[str | os.PathLike[str]]) -> None:
    """Pair each bench JSON with the artifact it measured: by target name, else by artifact path."""
    by_target = {a.target: a for a in artifacts}
    by_path = {a.path.resolve(): a for a in artifacts}
    for file in bench:
        path = Path(file)
        data = _read_bench(path)
        owner = by_target.get(data.get("target")) if data.get("target") else \
            by_path.get(Path(str(data.get("artifact", ""))).resolve())
        if owner is None:
            raise UsageError(f"Bench file '{path}' measured target '{data.get('target')}', which none of the "
                             f"artifacts is built for ({', '.join(sorted(by_target))}).")
        if owner.bench is not None:
            raise UsageError(f"Two bench files for target '{owner.target}': {owner.bench_source} and {path}.")
        owner.bench, owner.bench_source = data, path
    for artifact in artifacts:
        held = artifact.path / BENCH_FILE
        if artifact.bench is None and held.is_file():
            data = _read_bench(held)
            if data.get("target") not in (None, artifact.target):
                raise ArtifactError(f"'{held}' measured target '{data['target']}', not '{artifact.target}'.")
            artifact.bench, artifact.bench_source = data, held


def _model_name(artifacts: list[_Artifact], name: str | None) -> str:
    if name is not None:
        chosen = {sanitize(name)}
    else:
        chosen = {sanitize(Path(str(a.meta.get("model", {}).get("source") or a.path.name)).stem) for a in artifacts}
    if len(chosen) != 1:
        raise UsageError(f"The artifacts are compiled from different models ({', '.join(sorted(chosen))}): "
                         "publish each model on its own, or pass --name.")
    model = chosen.pop()
    if not model:
        raise UsageError("The model name is empty once sanitised: pass --name with letters or digits.")
    return model


def _epoch(artifacts: list[_Artifact]) -> int:
    """``SOURCE_DATE_EPOCH``, else the newest artifact creation time: reproducible either way."""
    env = os.environ.get("SOURCE_DATE_EPOCH")
    if env is not None:
        if not env.strip().isdigit():
            raise UsageError(f"SOURCE_DATE_EPOCH='{env}' is not a non-negative integer.")
        return int(env)
    times = []
    for artifact in artifacts:
        try:
            created = _dt.datetime.fromisoformat(str(artifact.meta.get("created")).replace("Z", "+00:00"))
            times.append(int(created.timestamp()))
        except ValueError:
            continue
    return max(times, default=0)


def _check_inputs(artifacts: list[_Artifact], output: Path, include_key: bool) -> list[str]:
    seen: dict[str, Path] = {}
    for artifact in artifacts:
        if artifact.target in seen:
            raise UsageError(f"Two artifacts for target '{artifact.target}': {seen[artifact.target]} and "
                             f"{artifact.path}. Publish one artifact per target.")
        seen[artifact.target] = artifact.path
    notes = []
    encrypted = [a for a in artifacts if a.meta["library"].get("encrypted")]
    if include_key and not encrypted:
        raise UsageError("--include-key: none of the artifacts is encrypted, so there is no key file to include.")
    for artifact in artifacts:
        if artifact in encrypted and include_key and not (artifact.path / KEY_FILE).is_file():
            raise ArtifactError(f"'{artifact.path}' is encrypted but has no {KEY_FILE} to include.")
        if artifact in encrypted and not include_key:
            notes.append(f"{artifact.target}: encrypted; {KEY_FILE} not included (pass --include-key to ship it).")
        if artifact not in encrypted and include_key:
            notes.append(f"{artifact.target}: not encrypted; no key file to include.")
    return notes


def _sums(entries: list[tuple[str, str]]) -> str:
    """``sha256sum`` format: ``<hex>  <name>`` per line, sorted by name."""
    return "".join(f"{sha}  {name}\n" for name, sha in sorted(entries))


def publish(artifacts: Iterable[str | os.PathLike[str]], version: str, output: str | os.PathLike[str], *,
            include_key: bool = False, force: bool = False, bench: Iterable[str | os.PathLike[str]] | None = None,
            name: str | None = None, with_runtime: bool = False) -> PublishResult:
    """Write one reproducible ``.tar.gz`` per artifact (target) into ``output``; see the module docstring.

    Parameters
    ----------
    artifacts:
        Artifact directories of one model, each for a different target.
    version:
        Release version, semver-like (``1.2.3``, ``1.2.3-rc.1``; a leading ``v`` is dropped).
    output:
        Directory to create (``DIST``); an existing non-empty one is replaced only with ``force``.
    include_key:
        Also ship ``modelKey.bin`` of encrypted artifacts (off by default: keys usually travel apart).
    bench:
        ``forgekit bench --json`` files, matched to artifacts by target; their numbers fill the latency table.
    name:
        Model name for file names and titles (default: the ONNX file name the artifacts were compiled from).
    with_runtime:
        Also ship the device runtime in ``runtime/`` where forgekit cross-builds one (aarch64, armhf, Android:
        libraries, ``forgekit-run``, the C/C++ headers; :mod:`.device_runtime`), built or taken from the cache;
        CUDA artifacts get the x86-64 runtime with TVM's CUDA runtime (:mod:`.cuda_runtime`).
    """
    version = parse_version(version)
    loaded = [_load_artifact(Path(p)) for p in artifacts]
    if not loaded:
        raise UsageError("No artifacts given: pass one or more artifact directories.")
    out = Path(output).absolute().resolve()
    notes = _check_inputs(loaded, out, include_key)
    _attach_bench(loaded, bench or [])
    model = _model_name(loaded, name)
    epoch = _epoch(loaded)
    date = _dt.datetime.fromtimestamp(epoch, _dt.timezone.utc).strftime("%Y-%m-%d")
    loaded.sort(key=lambda a: a.target)

    sources = [a.path for a in loaded] + [Path(b) for b in bench or []]
    with atomic_directory(out, force, kind="dist", inputs=sources) as tmp:
        stage = tmp / ".stage"
        plans = [_plan(a, model, version, include_key, stage, with_runtime) for a in loaded]
        notes += [f"{p['target']}: no cross-built runtime for this target (its card names the forgekit-runtime "
                  "wheel)" for p in plans if with_runtime and p["card"]["device"] is None]
        archives = [f"{p['top']}.tar.gz" for p in plans]
        notes_text = md.render(NOTES_FILE + ".j2", **release_context(
            model_name=model, version=version, date=date, cards=[p["card"] for p in plans], archives=archives))
        bundles = []
        for plan, archive in zip(plans, archives):
            bundles.append(_write_bundle(plan, notes_text, tmp / archive, out / archive, epoch))
        shutil.rmtree(stage)
        (tmp / NOTES_FILE).write_text(notes_text)
        (tmp / SUMS_FILE).write_text(_sums([(b.archive.name, b.sha256) for b in bundles]))
    return PublishResult(out, model, version, bundles, out / NOTES_FILE, out / SUMS_FILE, notes)


def _plan(artifact: _Artifact, model: str, version: str, include_key: bool, stage: Path,
          with_runtime: bool = False) -> dict[str, Any]:
    """The members of one bundle (sources and modes) and its rendered model card."""
    top = f"{model}-{sanitize(version)}-{sanitize(artifact.target)}"
    folder = stage / top
    folder.mkdir(parents=True)
    members = [*(Member(name, artifact.path / name) for name in library_files(artifact.meta)),
               Member(METADATA_FILE, artifact.path / METADATA_FILE)]
    if (artifact.path / REPORT_FILE).is_file():
        members.append(Member(REPORT_FILE, artifact.path / REPORT_FILE))
    if artifact.bench_source is not None:
        members.append(Member(BENCH_FILE, artifact.bench_source))
    key_included = include_key and bool(artifact.meta["library"].get("encrypted"))
    if key_included:
        members.append(Member(KEY_FILE, artifact.path / KEY_FILE, SECRET_MODE))
    runtime = runtime_members(artifact.target, meta=artifact.meta) if with_runtime else []
    members += runtime
    device = device_commands(top, runtime, artifact.meta.get("model", {}).get("inputs") or [],
                             bool(artifact.meta["library"].get("encrypted")), artifact.meta)
    if device is not None and is_cuda(artifact.meta):  # how to run it, next to the binaries
        (folder / "runtime-README.md").write_text(cuda_readme(top, device, artifact.meta))
        members.append(Member(README_FILE, folder / "runtime-README.md"))
    files = []
    for member in sorted(members, key=lambda m: m.name):
        sha, size = file_digest(member.source)
        files.append({"name": member.name, "size": size, "sha256": sha})
    chart = latency_svg(artifact.bench, f"{model} {version} on {artifact.target}") if artifact.bench else None
    if chart is not None:  # rendered here, listed in the card's files like the others
        (folder / CHART_FILE).write_text(chart)
        members.append(Member(CHART_FILE, folder / CHART_FILE))
        sha, size = file_digest(folder / CHART_FILE)
        files.append({"name": CHART_FILE, "size": size, "sha256": sha})
        files.sort(key=lambda f: f["name"])
    card = card_context(artifact.meta, model_name=model, version=version, bundle=top, files=files,
                        key_included=key_included, key_file=KEY_FILE, bench=artifact.bench,
                        bench_source=BENCH_FILE if artifact.bench is not None else None,
                        chart=CHART_FILE if chart is not None else None, device=device)
    (folder / CARD_FILE).write_text(md.render(CARD_FILE + ".j2", **card))
    members.append(Member(CARD_FILE, folder / CARD_FILE))
    return {"top": top, "folder": folder, "members": members, "files": files, "card": card,
            "target": artifact.target, "key_included": key_included}


def _write_bundle(plan: dict[str, Any], notes_text: str, path: Path, final: Path, epoch: int) -> Bundle:
    folder: Path = plan["folder"]
    (folder / NOTES_FILE).write_text(notes_text)
    members = [*plan["members"], Member(NOTES_FILE, folder / NOTES_FILE)]
    entries = [(f["name"], f["sha256"]) for f in plan["files"]]
    entries += [(m, file_digest(folder / m)[0]) for m in (CARD_FILE, NOTES_FILE)]
    (folder / SUMS_FILE).write_text(_sums(entries))
    members.append(Member(SUMS_FILE, folder / SUMS_FILE))
    write_reproducible_tar_gz(path, plan["top"], members, epoch)
    sha, size = file_digest(path)
    return Bundle(plan["target"], final, sha, size, sorted(m.name for m in members), plan["key_included"],
                  plan["card"]["latency"] is not None)
