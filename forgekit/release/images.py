"""forgekit's Docker images: the wheelhouse they install from, and how they are built.

Every image starts from one shared base (``images/base/Dockerfile``: a Python 3.11 Debian image, forgekit in
``/opt/forgekit``, a non-root user, ``ENTRYPOINT ["forgekit"]``) and adds the toolchain of its targets.  The
base installs forgekit with ``pip install --no-index`` from a *wheelhouse* made on the host
(:func:`build_wheelhouse`), so a build needs neither PyPI nor a TLS setup inside the container: an
air-gapped machine builds the images from the wheelhouse and a base image alone.  Where no registry is
reachable at all, :func:`debootstrap_base` makes that base image from Debian packages (``debootstrap`` +
``docker import``).

Users and CI build the same way: ``forgekit images build cpu --base-image ... --wheelhouse DIR``
(:func:`build_image`), which builds the shared base first and then the image on top of it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from .. import __version__
from ..artifact.outputs import atomic_directory, check_output
from ..errors import NotAvailableError, ToolchainError, UsageError
from ..toolchain import require

#: What ``BASE_IMAGE`` defaults to in the Dockerfiles (the official Python image, Debian bookworm).
DEFAULT_BASE_IMAGE = "python:3.11.11-slim-bookworm"
#: Debian release and packages of the base that :func:`debootstrap_base` makes (python3 is 3.11 there).
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBOOTSTRAP_PACKAGES = ("python3", "python3-venv", "ca-certificates")


@dataclass(frozen=True)
class ImageSpec:
    """One image: its Dockerfile (relative to the source tree) and what it builds on."""

    dockerfile: str
    description: str
    #: Name of the image it is built ``FROM`` (passed as the ``FORGEKIT_BASE`` build arg); None: BASE_IMAGE.
    parent: str | None = "base"
    #: Extra wheels (beyond forgekit's and its parents') this image installs from the wheelhouse.
    wheels: tuple[str, ...] = ()
    #: Distributions those wheels depend on that forgekit's base does not have.
    deps: tuple[str, ...] = ()

    def context_wheels(self, wheelhouse: Path) -> list[Path]:
        """The wheels this image's Dockerfile installs: forgekit's for the base, else only its extra ones.

        Only those go into the build context, so an image layer never carries the whole wheelhouse.
        """
        files = sorted(wheelhouse.glob("*.whl"))
        if self.parent is None:  # forgekit and its dependencies: not the wheels other images add on top
            extra = {_dist_name(w) for spec in IMAGES.values() for w in spec.wheels + spec.deps}
            return [f for f in files if _dist_name(f.name.split("-")[0]) not in extra]
        if not self.wheels:
            return []
        # Exactly the named wheels and their known dependencies: anything else is in a parent image already.
        # (A new dependency shows up as pip's "No matching distribution" at build time: add it to ``deps``.)
        names = {_dist_name(w) for w in self.wheels + self.deps}
        return [f for f in files if _dist_name(f.name.split("-")[0]) in names]


def _dist_name(requirement: str) -> str:
    """Normalized distribution name of a requirement or wheel file stem (PEP 503)."""
    return re.sub(r"[-_.]+", "-", re.split(r"[<>=!~ \[;]", requirement, maxsplit=1)[0]).lower()


# CUDA 13 nvcc from NVIDIA's PyPI wheels: the same toolkit pieces forgekit is tested with, and installable
# from a wheelhouse (NVIDIA's apt/container registries are not needed to *compile* for CUDA).
_NVCC_WHEELS = ("nvidia-cuda-nvcc>=13.0,<14", "nvidia-cuda-crt>=13.0,<14", "nvidia-cuda-cccl>=13.0,<14",
                "nvidia-cuda-runtime>=13.0,<14", "nvidia-nvvm>=13.0,<14")
# Loading CUDA artifacts on a GPU machine: NVRTC through cuda-bindings (TVM's default loader path).
_GPU_RUNTIME_WHEELS = ("cuda-bindings>=13,<14", "nvidia-cuda-nvrtc>=13.0,<14")

#: The images forgekit ships (``forgekit images list``).
IMAGES: dict[str, ImageSpec] = {
    "base": ImageSpec("images/base/Dockerfile", "forgekit on Python 3.11, no toolchain (shared base)", None),
    "cpu": ImageSpec("Dockerfile.cpu", "x86-64 host, aarch64/armhf cross g++, clang+lld for Android (no NDK)"),
    "cuda": ImageSpec("Dockerfile.cuda", "CUDA targets: nvcc 13 from NVIDIA's wheels, no GPU needed",
                      wheels=_NVCC_WHEELS),
    "aarch64": ImageSpec("images/aarch64/Dockerfile", "aarch64 Linux boards: aarch64 cross g++"),
    "android": ImageSpec("images/android/Dockerfile", "Android: the Android NDK (downloaded at build time)"),
    "cuda-gpu": ImageSpec("images/cuda/Dockerfile", "cuda + NVRTC/cudart to run, bench and tune on a GPU host",
                          "cuda", wheels=_GPU_RUNTIME_WHEELS, deps=("cuda-pathfinder",)),
    "ti": ImageSpec("images/ti/Dockerfile", "TI Jacinto/Sitara: aarch64 + TI's TIDL tools (licensed, supplied by you)",
                    "aarch64"),
}


def get_image(name: str) -> ImageSpec:
    """The spec of image ``name``; a one-line :class:`UsageError` listing the valid names otherwise."""
    try:
        return IMAGES[name]
    except KeyError:
        raise UsageError(f"Unknown image '{name}': choose one of {', '.join(IMAGES)}.") from None


def lineage(name: str) -> list[str]:
    """``name`` and the images it is built on, base last (``ti`` -> ti, aarch64, base)."""
    chain = [name]
    while get_image(chain[-1]).parent:
        chain.append(get_image(chain[-1]).parent)
    return chain


def image_tag(name: str, prefix: str = "forgekit") -> str:
    """Default tag of an image: ``forgekit/<name>:<forgekit version>``."""
    return f"{prefix}/{name}:{__version__}"


def source_root() -> Path:
    """The forgekit source tree holding the Dockerfiles (images are built from a checkout, not a wheel)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "Dockerfile.cpu").is_file() or not (root / "pyproject.toml").is_file():
        raise NotAvailableError("The Dockerfiles are not installed with forgekit: run this from a source "
                                "checkout (git clone, then pip install -e .).")
    return root


def _run(argv: Sequence[str], log: Callable[[str], None], what: str, env: dict[str, str] | None = None) -> None:
    """Run a tool, streaming its output to ``log``; a failure is a one-line error naming the last lines."""
    log("$ " + " ".join(argv))
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **env} if env else None)
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        log(line.rstrip("\n"))
        tail = (tail + [line.strip()])[-3:]
    if proc.wait() != 0:
        detail = " | ".join(t for t in tail if t) or f"exit code {proc.returncode}"
        raise ToolchainError(f"{what} failed: {detail}")


def build_wheelhouse(dest: str | os.PathLike[str], *, images: Iterable[str] = ("cpu",),
                     platform: str | None = None, force: bool = False,
                     log: Callable[[str], None] = print) -> Path:
    """Fill ``dest`` with the wheels of forgekit and everything the given images install.

    ``pip wheel --no-deps`` builds forgekit itself from the source tree; ``pip download --only-binary``
    fetches its dependencies (and the images' extra wheels) for CPython 3.11 on ``platform`` (default: this
    machine's, e.g. ``manylinux_2_28_aarch64`` for an arm64 image).  The images then install with
    ``pip install --no-index --find-links``, offline.  Built in a temporary sibling, renamed when complete.
    """
    check_output(dest, force=force, kind="wheelhouse")  # before anything else: a refused output is one line
    root = source_root()
    dest = Path(dest)
    extra = sorted({wheel for name in images for image in lineage(name) for wheel in get_image(image).wheels})
    with atomic_directory(dest, force, kind="wheelhouse", inputs=[root]) as tmp:
        pip = [sys.executable, "-m", "pip"]
        # A fixed timestamp makes the wheel byte-identical for the same source, so Docker's layer cache
        # keeps the images' install layers until forgekit itself changes.
        _run([*pip, "wheel", "--no-deps", "--quiet", "--wheel-dir", str(tmp), str(root)], log, "pip wheel forgekit",
             env={"SOURCE_DATE_EPOCH": os.environ.get("SOURCE_DATE_EPOCH", "315532800")})
        wheel = next(tmp.glob("forgekit-*.whl"))
        target = ["--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp"]
        if platform:
            target += ["--platform", platform]
        _run([*pip, "download", "--quiet", "--dest", str(tmp), *target, str(wheel), *extra], log,
             "pip download (forgekit's dependencies)")
    log(f"wheelhouse: {dest} ({len(list(dest.glob('*.whl')))} wheels)")
    return dest


def docker_cli() -> str:
    """The docker client, or a one-line error saying how to get a Docker engine."""
    return require("docker", "docker.io")


def docker_ready() -> str | None:
    """None when a Docker daemon answers; otherwise why not (one line)."""
    if not shutil.which("docker"):
        return "the docker client is not installed (Debian package docker.io)"
    proc = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True,
                          text=True, timeout=60)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return f"no Docker daemon answers ({lines[-1] if lines else 'docker version failed'})"
    return None


def image_exists(tag: str) -> bool:
    """Whether the local Docker engine has an image called ``tag``."""
    return subprocess.run([docker_cli(), "image", "inspect", tag], capture_output=True).returncode == 0


def debootstrap_base(tag: str, *, rootfs_tar: str | os.PathLike[str] | None = None,
                     mirror: str = DEBIAN_MIRROR, log: Callable[[str], None] = print) -> str:
    """Make a Debian bookworm base image (python3 3.11 + venv) without any registry: debootstrap + import.

    For machines that cannot pull ``python:3.11-slim``: ``debootstrap --variant=minbase`` needs only a
    Debian mirror (or a local one).  With ``rootfs_tar`` the rootfs tarball is kept there and reused on
    the next call (the slow part is debootstrap, about a minute).  Needs root.  Returns ``tag``.
    """
    docker = docker_cli()
    cached = Path(rootfs_tar) if rootfs_tar else None
    with tempfile.TemporaryDirectory(prefix="forgekit-rootfs-") as work:
        tarball = cached or Path(work) / "rootfs.tar"
        if not tarball.is_file():
            if os.geteuid() != 0:
                raise UsageError("debootstrap needs root: run it as root (or pull a Python 3.11 base image "
                                 "and pass it as --base-image).")
            debootstrap = require("debootstrap", "debootstrap")
            rootfs = Path(work) / "rootfs"
            _run([debootstrap, "--variant=minbase", f"--include={','.join(DEBOOTSTRAP_PACKAGES)}", DEBIAN_SUITE,
                  str(rootfs), mirror], log, "debootstrap")
            # apt lists and caches only make the image bigger; the Dockerfiles run apt-get update themselves.
            for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for entry in (rootfs / junk).glob("*.deb" if "archives" in junk else "*_*"):
                    entry.unlink()
            tarball.parent.mkdir(parents=True, exist_ok=True)
            partial = tarball.with_name(tarball.name + ".part")
            _run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(partial), "."], log, "tar rootfs")
            os.replace(partial, tarball)
        _run([docker, "import", "--change", 'CMD ["python3"]', str(tarball), tag], log, "docker import")
    return tag


def build_context(spec: ImageSpec, wheelhouse: Path | None, tidl: Path | None = None) -> Path:
    """A build context holding exactly what the Dockerfiles COPY: ``wheelhouse/``, ``tidl/`` and the base image's
    ``images/base/entrypoint.sh``.

    Files are hard-linked when possible (the wheelhouse is hundreds of MB).  The caller removes it.
    """
    ctx = Path(tempfile.mkdtemp(prefix="forgekit-docker-ctx-"))
    content = {"wheelhouse": spec.context_wheels(wheelhouse) if wheelhouse else [], "tidl": [tidl] if tidl else [],
               "images/base": [source_root() / "images" / "base" / "entrypoint.sh"]}
    for sub, files in content.items():
        (ctx / sub).mkdir(parents=True)
        # An empty folder still has to exist: COPY fails on a missing source.
        (ctx / sub / ".keep").touch()
        for file in files:
            try:
                os.link(file, ctx / sub / file.name)
            except OSError:
                shutil.copy2(file, ctx / sub / file.name)
    return ctx


def build_image(name: str, *, wheelhouse: str | os.PathLike[str] | None = None, base_image: str | None = None,
                tag: str | None = None, build_args: dict[str, str] | None = None, tidl: str | None = None,
                rebuild_parents: bool = False, log: Callable[[str], None] = print) -> str:
    """Build image ``name`` (and the images it is built on, when missing) with ``docker build``; its tag.

    ``base_image`` is the Python 3.11 Debian image everything starts from (``BASE_IMAGE``, default the
    official slim image).  ``wheelhouse`` (from :func:`build_wheelhouse`) is needed to build the shared
    base.  ``tidl`` is the TI TIDL tools archive for the ``ti`` image.  Parents are rebuilt only when
    missing, unless ``rebuild_parents``.
    """
    spec = get_image(name)
    root = source_root()
    docker = docker_cli()
    tag = tag or image_tag(name)
    args = dict(build_args or {})
    # Check this image's own inputs before spending minutes on its parents.
    needs = ["forgekit-*.whl"] if spec.parent is None else [f"{_dist_name(w).replace('-', '_')}-*.whl"
                                                            for w in spec.wheels]
    missing = [n for n in needs if wheelhouse is None or not any(Path(wheelhouse).glob(n))]
    if missing:
        raise UsageError(f"The '{name}' image installs {', '.join(m.split('-*')[0] for m in missing)} from a "
                         f"wheelhouse: make one with 'forgekit images wheelhouse DIR --image {name}' and pass "
                         "--wheelhouse DIR.")
    if tidl and (name != "ti" or not Path(tidl).is_file()):
        raise UsageError(f"--tidl is for the ti image and must name TI's tidl_tools.tar.gz ('{tidl}' is not one).")
    if spec.parent:
        parent_tag = image_tag(spec.parent)
        if rebuild_parents or not image_exists(parent_tag):
            build_image(spec.parent, wheelhouse=wheelhouse, base_image=base_image, build_args=build_args,
                        rebuild_parents=rebuild_parents, log=log)
        args["FORGEKIT_BASE"] = parent_tag
    else:
        args["BASE_IMAGE"] = base_image or DEFAULT_BASE_IMAGE
        args.setdefault("FORGEKIT_VERSION", __version__)  # the OCI version label
    ctx = build_context(spec, Path(wheelhouse) if wheelhouse else None, Path(tidl) if tidl else None)
    try:
        # --force-rm: a failed step's container is removed too (the legacy builder kept one per failed build:
        # the ti image without TI's tools left a stopped container, and its 1 GB image, on every CI run)
        argv = [docker, "build", "--force-rm", "--file", str(root / spec.dockerfile), "--tag", tag]
        for key, value in sorted(args.items()):
            argv += ["--build-arg", f"{key}={value}"]
        _run([*argv, str(ctx)], log, f"docker build of the '{name}' image")
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    log(f"built {tag}")
    return tag
