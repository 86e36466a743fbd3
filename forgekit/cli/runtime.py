"""``forgekit runtime``: the TVM + forgekit C runtime cross-built for a target that has no wheel (adapters over
:mod:`forgekit.deploy.cross`)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from .. import log
from .app import app, command

runtime_app = typer.Typer(help="Cross-build the C runtime (libtvm_runtime, libforgekit_runtime, forgekit-run).",
                          no_args_is_help=True, rich_markup_mode=None)
app.add_typer(runtime_app, name="runtime")


@runtime_app.command("build")
@command
def runtime_build(
    target: Annotated[str, typer.Option("--target", "-t", metavar="TAG", help="Target tag, e.g. raspberry-pi/4-armhf, "
                                        "arm/aarch64, android/arm64-v8a (Android: needs ANDROID_NDK_HOME).")],
    output: Annotated[str, typer.Option("--output", "-o", metavar="DIR", help="Directory to copy the libraries and "
                                        "forgekit-run into (created).")],
    tvm_source: Annotated[Optional[str], typer.Option("--tvm-source", metavar="DIR", help="TVM source tree of the "
                                                      "installed version, for the headers the wheel lacks (default "
                                                      "$FORGEKIT_TVM_SOURCE, else the vendored ones).")] = None,
) -> None:
    """Build (or reuse from ~/.cache/forgekit/runtime) the runtime for TAG and copy it into DIR."""
    from ..deploy.cross import build_cross_runtime, install

    build = build_cross_runtime(target, tvm_source=tvm_source, log=log.status)
    for path in install(build, output):
        print(f"{path}  {path.stat().st_size // 1024} KiB")
