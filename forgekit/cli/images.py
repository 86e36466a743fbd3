"""``forgekit images``: build forgekit's Docker images offline (adapters over :mod:`forgekit.release.images`)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..errors import UsageError
from .app import app, command
from .options import ForceOpt

images_app = typer.Typer(help="Build forgekit's Docker images (offline, from a host-side wheelhouse).",
                         no_args_is_help=True, rich_markup_mode=None)
app.add_typer(images_app, name="images")


@images_app.command("list")
@command
def images_list() -> None:
    """List the images, their Dockerfiles and what they are for."""
    from ..release.images import IMAGES

    for image, spec in IMAGES.items():
        print(f"{image:9s} {spec.dockerfile:28s} {spec.description}")


@images_app.command("wheelhouse")
@command
def images_wheelhouse(
    dest: Annotated[str, typer.Argument(metavar="DIR", help="Directory to fill with wheels.")],
    image: Annotated[Optional[list[str]], typer.Option("--image", metavar="NAME", help="Images whose extra wheels "
                                                       "to include (default cpu).")] = None,
    platform: Annotated[Optional[str], typer.Option("--platform", metavar="TAG", help="pip platform tag of the "
                                                    "image, e.g. manylinux_2_28_aarch64.")] = None,
    force: ForceOpt = False,
) -> None:
    """Download forgekit's wheels (and build forgekit's own) for offline image builds."""
    from ..release.images import build_wheelhouse

    build_wheelhouse(dest, images=image or ["cpu"], platform=platform, force=force)


BaseTagArg = Annotated[str, typer.Argument(metavar="TAG", help="Tag of the base image, e.g. "
                                           "local/bookworm-python:3.11.")]
RootfsTarOpt = Annotated[Optional[str], typer.Option("--rootfs-tar", metavar="FILE", help="Keep (and reuse) the "
                                                     "rootfs tarball here.")]
MirrorOpt = Annotated[str, typer.Option("--mirror", metavar="URL", help="Debian mirror.")]


@images_app.command("debootstrap")
@command
def images_debootstrap(tag: BaseTagArg, rootfs_tar: RootfsTarOpt = None,
                       mirror: MirrorOpt = "http://deb.debian.org/debian") -> None:
    """Make a Python 3.11 Debian base image without any registry (debootstrap + docker import; root)."""
    from ..release.images import debootstrap_base

    print(f"base image: {debootstrap_base(tag, rootfs_tar=rootfs_tar, mirror=mirror)}")


@images_app.command("build")
@command
def images_build(
    image: Annotated[str, typer.Argument(metavar="NAME", help="base, cpu, cuda, aarch64, android, cuda-gpu or ti.")],
    wheelhouse: Annotated[Optional[str], typer.Option("--wheelhouse", metavar="DIR", help="From 'forgekit images "
                                                      "wheelhouse'.")] = None,
    base_image: Annotated[Optional[str], typer.Option("--base-image", metavar="IMAGE", help="Python 3.11 Debian image "
                                                      "to start from.")] = None,
    tag: Annotated[Optional[str], typer.Option("--tag", metavar="TAG", help="Image tag (default forgekit/NAME:VERSION).")]
    = None,
    build_arg: Annotated[Optional[list[str]], typer.Option("--build-arg", metavar="KEY=VALUE", help="For docker "
                                                           "build.")] = None,
    tidl: Annotated[Optional[str], typer.Option("--tidl", metavar="FILE", help="TI's tidl_tools.tar.gz (ti image).")]
    = None,
    rebuild: Annotated[bool, typer.Option("--rebuild", help="Also rebuild the images it is built on.")] = False,
) -> None:
    """Build an image (and the shared base it needs) with docker build."""
    from ..release.images import build_image

    args = {}
    for item in build_arg or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--build-arg '{item}' is not KEY=VALUE.")
        args[key] = value
    build_image(image, wheelhouse=wheelhouse, base_image=base_image, tag=tag, build_args=args, tidl=tidl,
                rebuild_parents=rebuild)
