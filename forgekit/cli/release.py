"""``forgekit publish``, ``targets`` and ``images``: releases, the target list, Docker images."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..errors import UsageError
from .app import app, command, deprecated, old_spellings
from .options import ForceOpt, JsonOpt, write_json


@app.command()
@command
def publish(
    artifacts: Annotated[list[str], typer.Argument(metavar="ARTIFACT...", help="Artifact directories of one model, "
                                                   "one per target.")],
    version: Annotated[str, typer.Option("--version", metavar="V", help="Release version (1.2.0, v1.2.0-rc.1).")],
    output: Annotated[str, typer.Option("--output", "-o", metavar="DIR", help="Directory for the archives.")],
    include_key: Annotated[bool, typer.Option("--include-key", help="Also ship modelKey.bin of encrypted "
                                              "artifacts.")] = False,
    bench: Annotated[Optional[list[str]], typer.Option("--bench", metavar="FILE", help="A 'forgekit bench --json' "
                                                       "result; its target picks the bundle.")] = None,
    name: Annotated[Optional[str], typer.Option("--name", metavar="NAME", help="Model name in file names "
                                                "(default: the ONNX file name).")] = None,
    with_runtime: Annotated[bool, typer.Option("--with-runtime", help="Also ship the device runtime (forgekit-run, "
                                               "its libraries, the C API headers) in runtime/ for aarch64, armhf "
                                               "and Android targets.")] = False,
    force: ForceOpt = False,
    json_out: JsonOpt = None,
) -> None:
    """Package artifacts as versioned, reproducible .tar.gz bundles with a model card, notes and SHA256SUMS."""
    from ..release.publish import publish as publish_artifacts

    result = publish_artifacts(artifacts, version, output, include_key=include_key, force=force, bench=bench, name=name,
                                with_runtime=with_runtime)
    for bundle in result.bundles:
        print(f"{bundle.archive}  sha256 {bundle.sha256}  ({bundle.target}, latency "
              f"{'measured' if bundle.latency_measured else 'not measured'})")
    for note in result.notes:
        print(f"note: {note}")
    print(f"release notes: {result.release_notes}")
    write_json(json_out, result.to_dict())


def _verbose_is_strings(args: list[str]) -> list[str]:
    """``targets --verbose/-v`` showed each tag's string in the first releases, before ``-v`` became the shared
    "TVM's output" flag (which ``targets``, running no TVM, has no use for): it is ``--strings`` here."""
    if "-v" in args or "--verbose" in args:
        deprecated("targets --verbose/-v", "targets --strings")
    return ["--strings" if arg in ("-v", "--verbose") else arg for arg in args]


@app.command(cls=old_spellings(_verbose_is_strings))
@command
def targets(
    family: Annotated[Optional[str], typer.Option("--family", metavar="F", help="cuda, x86, arm or android.")] = None,
    strings: Annotated[bool, typer.Option("--strings", help="Show each tag's target string.")] = False,
) -> None:
    """List the target tags forgekit accepts (its own first, then TVM's)."""
    from ..targets import list_target_tags

    try:
        rows = list_target_tags(verbose=True, family=family)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for tag, text in rows:
        print(f"{tag:40s} {text}" if strings else tag)
