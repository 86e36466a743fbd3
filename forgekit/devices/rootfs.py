"""A cached Debian root filesystem for running cross-built artifacts under qemu user-mode emulation.

An aarch64 artifact is only proven by running it.  Without a board, forgekit runs it in an arm64 Debian
bookworm chroot (bookworm's python3 is 3.11, like forgekit's) through ``qemu-aarch64-static``, with the
aarch64 wheels of the exact TVM runtime, tvm-ffi and numpy versions installed on the host.

The rootfs is built once (debootstrap, about a minute or two plus downloads) and cached under
``$FORGEKIT_CACHE/rootfs`` (default ``$XDG_CACHE_HOME/forgekit/rootfs``, i.e. ``~/.cache/forgekit/rootfs``)
in a directory named after a hash of its recipe, so a version bump builds a new one.  It is built in a
temporary directory and renamed into place only when complete: a cache entry is never half-built.

Building needs root (debootstrap, chroot), ``debootstrap``, ``qemu-user-static`` and a ``binfmt_misc``
registration of qemu for the guest architecture: debootstrap's second stage executes arm64 binaries
(dpkg, maintainer scripts) that exec further arm64 binaries, which only the kernel can route to qemu.
Running an artifact in a built rootfs calls qemu explicitly and needs root (chroot) but no binfmt.

A *bare* rootfs (debootstrap minbase: no Python, no wheels) is a device without Python, for the C runtime
cross-built by :mod:`forgekit.deploy.cross` and ``forgekit-run``; armhf (Raspberry Pi OS 32-bit) has
only that kind, since apache-tvm has no armv7 wheel.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

from ..errors import NotAvailableError, ToolchainError
from ..log import last_line
from ..toolchain import require

#: Bump when the recipe below changes in a way the hash of its inputs does not capture.
RECIPE_VERSION = 1
SUITE = "bookworm"  # python3 is 3.11 there, the version forgekit's wheels are built for
APT_PACKAGES = ("python3",)
#: Host-installed distributions whose exact versions go into the rootfs (forgekit.runtime imports
#: numpy and tvm_ffi, loads libtvm_runtime.so from the apache-tvm wheel, and imports forgekit.crypto).
WHEEL_DISTRIBUTIONS = ("apache-tvm", "apache-tvm-ffi", "numpy", "cryptography")
#: Guest-only packages, pinned here since the host need not have them: TVM's RPC server
#: (``python3 -m tvm.exec.rpc_server``, see :mod:`forgekit.devices.rpc`) ships its session loop to a worker
#: process with cloudpickle, which the apache-tvm wheel does not declare.
GUEST_ONLY = ("cloudpickle==3.1.1",)
PYTHON_VERSION = "3.11"
#: Where bookworm's python3 looks for locally installed packages.
SITE_PACKAGES = "usr/local/lib/python3.11/dist-packages"
_STAMP = ".forgekit-rootfs.json"
_GLIBC_MINOR = 36  # bookworm's glibc


@dataclass(frozen=True)
class GuestArch:
    """An architecture forgekit can emulate: its names for Debian, qemu and pip."""

    arch: str  # forgekit's name (metadata build.arch)
    debian: str  # Debian architecture for debootstrap
    qemu: str  # the qemu-user-static binary
    binfmt: str  # name of qemu's binfmt_misc entry
    platform: str  # pip --platform tag of the wheels: manylinux_2_<glibc minor>_<machine>
    python: bool = True  # python3 + the runtime wheels installed (False: a bare rootfs for forgekit-run)

    def platforms(self) -> list[str]:
        """Every manylinux tag the guest's glibc (bookworm: 2.36) runs, newest first: pip does not infer
        the older ones from the newest (cffi, for one, only ships manylinux_2_17 wheels)."""
        machine = self.platform.split("_", 3)[3]
        return [f"manylinux_2_{minor}_{machine}" for minor in range(_GLIBC_MINOR, 16, -1)] + [f"manylinux2014_{machine}"]


GUESTS = {
    "aarch64": GuestArch("aarch64", "arm64", "qemu-aarch64-static", "qemu-aarch64", "manylinux_2_36_aarch64"),
}
#: Bare rootfs (minbase, no Python) for the cross-built C runtime (forgekit.deploy.cross, forgekit-run): a
#: device without Python, and armhf, which has no apache-tvm wheel (so it is not in GUESTS: forgekit's
#: Python devices cannot use it).
BARE_GUESTS = {
    "aarch64": GuestArch("aarch64", "arm64", "qemu-aarch64-static", "qemu-aarch64", "", python=False),
    "arm": GuestArch("arm", "armhf", "qemu-arm-static", "qemu-arm", "", python=False),
}


def guest(arch: str, bare: bool = False) -> GuestArch:
    """The emulation recipe for ``arch`` (``bare``: without Python) or a one-line :class:`NotAvailableError`."""
    try:
        return BARE_GUESTS[arch] if bare else GUESTS[arch]
    except KeyError:
        raise NotAvailableError(f"forgekit cannot emulate '{arch}' artifacts (only {', '.join(GUESTS)}): "
                                "run them on such a machine.") from None


def cache_dir() -> Path:
    """Root of the rootfs cache: ``$FORGEKIT_CACHE/rootfs``, else ``$XDG_CACHE_HOME/forgekit/rootfs``."""
    if os.environ.get("FORGEKIT_CACHE"):
        return Path(os.environ["FORGEKIT_CACHE"]) / "rootfs"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "forgekit" / "rootfs"


def wheel_requirements() -> list[str]:
    """``name==version`` of each runtime distribution, pinned to what the host has installed, plus the
    guest-only packages (:data:`GUEST_ONLY`)."""
    out = []
    for dist in WHEEL_DISTRIBUTIONS:
        try:
            out.append(f"{dist}=={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            raise ToolchainError(f"'{dist}' is not installed on this machine: reinstall forgekit.") from None
    return out + list(GUEST_ONLY)


def recipe_key(g: GuestArch) -> str:
    """Short hash of everything that determines the rootfs contents."""
    recipe = {"v": RECIPE_VERSION, "suite": SUITE, "arch": g.debian, "apt": _apt(g),
              "wheels": wheel_requirements() if g.python else [], "platform": g.platform}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def _apt(g: GuestArch) -> tuple[str, ...]:
    return APT_PACKAGES if g.python else ()


def rootfs_path(arch: str = "aarch64", bare: bool = False) -> Path:
    """Where the rootfs for ``arch`` is (or would be) cached."""
    g = guest(arch, bare)
    return cache_dir() / f"{g.debian}-{recipe_key(g)}"


def _require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise NotAvailableError(f"{what} needs root (debootstrap and chroot): run it as root or with sudo.")


def _qemu(g: GuestArch) -> str:
    return require(g.qemu, "qemu-user-static")


def ensure_binfmt(g: GuestArch) -> None:
    """Make sure the kernel hands ``g``'s binaries to qemu, registering qemu like binfmt-support's boot
    service would (containers do not run it); else a one-line :class:`ToolchainError`."""
    entry = Path("/proc/sys/fs/binfmt_misc") / g.binfmt
    if entry.is_file() and entry.read_text().startswith("enabled"):
        return
    update = shutil.which("update-binfmts")
    if update is None:
        raise ToolchainError(f"{g.qemu} is not registered with binfmt_misc: install the Debian package "
                             "'binfmt-support' (with 'qemu-user-static').")
    if not Path("/proc/sys/fs/binfmt_misc/register").exists():
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", "/proc/sys/fs/binfmt_misc"],
                       capture_output=True, check=False)
    subprocess.run([update, "--enable", g.binfmt], capture_output=True, check=False)
    if not (entry.is_file() and entry.read_text().startswith("enabled")):
        raise ToolchainError(f"Cannot register {g.binfmt} with binfmt_misc (a container without --privileged?): "
                             f"run 'update-binfmts --enable {g.binfmt}' on the host.")


def ensure_rootfs(arch: str = "aarch64", log: Callable | None = None, bare: bool = False) -> Path:
    """Path of a complete, cached rootfs for ``arch``, building it first when there is none.

    ``bare``: a minbase rootfs without Python (:data:`BARE_GUESTS`), for the cross-built C runtime.
    ``log`` (default: nothing) receives one-line progress messages.  Raises :class:`ToolchainError`
    (naming the Debian package) when a tool is missing and :class:`NotAvailableError` when not root.
    """
    g = guest(arch, bare)
    final = rootfs_path(arch, bare)
    if (final / _STAMP).is_file():
        return final
    debootstrap = require("debootstrap", "debootstrap")
    qemu = _qemu(g)
    _require_root(f"Building the {g.debian} rootfs")
    ensure_binfmt(g)
    final.parent.mkdir(parents=True, exist_ok=True)
    with _lock(final.parent / f".{final.name}.lock"):
        if (final / _STAMP).is_file():  # another process built it while we waited
            return final
        say = log or (lambda message: None)
        for stale in final.parent.glob(f".{final.name}.*.tmp"):  # an interrupted build's (we hold the lock)
            _unmount_below(stale)
            shutil.rmtree(stale, ignore_errors=True)
        start = time.monotonic()
        wheels = _wheelhouse(g, say) if g.python else None
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
        try:
            _build(g, tmp, debootstrap, qemu, wheels, say)
            stamp = {"recipe": recipe_key(g), "suite": SUITE, "arch": g.debian, "apt": list(_apt(g)),
                     "wheels": wheel_requirements() if g.python else [],
                     "build_seconds": round(time.monotonic() - start, 1)}
            (tmp / _STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
            _unmount_below(tmp)
            os.replace(tmp, final)
        except BaseException:
            _unmount_below(tmp)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        say(f"rootfs ready: {final} ({time.monotonic() - start:.0f} s)")
    return final


def _build(g: GuestArch, root: Path, debootstrap: str, qemu: str, wheels: Path | None, say: Callable) -> None:
    mirror = os.environ.get("FORGEKIT_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    say(f"debootstrap {SUITE} {g.debian} (first stage)")
    include = [f"--include={','.join(_apt(g))}"] if _apt(g) else []
    _run([debootstrap, "--foreign", f"--arch={g.debian}", "--variant=minbase", *include,
          SUITE, str(root), mirror], "debootstrap (first stage)")
    # The static qemu inside the tree lets `chroot ROOT /usr/bin/qemu-... /usr/bin/python3` work without
    # binfmt; with binfmt's F flag the kernel already holds the host's copy open.
    shutil.copy2(qemu, root / "usr" / "bin" / Path(qemu).name)
    say("debootstrap second stage (under qemu)")
    _run([require("chroot", "coreutils"), str(root), "/debootstrap/debootstrap", "--second-stage"], "debootstrap (second stage)")
    if wheels is None:  # a bare rootfs: minbase has libstdc++, all forgekit-run needs besides its libraries
        out = run_in_rootfs(root, g, ["/bin/sh", "-c", "echo ok"], timeout=600)
        if out.returncode != 0 or "ok" not in out.stdout:
            raise ToolchainError(f"The {g.debian} rootfs does not work: {last_line(out.stderr)}")
        return
    say("installing the runtime wheels")
    # pip runs on the host (pip inside the chroot would be slow under qemu, and would have to verify
    # this network's TLS): --platform/--python-version pick the guest's wheels, --target puts them where
    # the guest's python3 looks.
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
          "--find-links", str(wheels), "--only-binary=:all:", *_platform_args(g),
          "--python-version", PYTHON_VERSION, "--implementation", "cp", "--target", str(root / SITE_PACKAGES),
          *wheel_requirements()], "pip install (guest wheels)")
    for leftover in (root / "var" / "cache" / "apt" / "archives").glob("*.deb"):
        leftover.unlink()
    say("smoke test: python3 imports numpy and tvm_ffi and loads libtvm_runtime.so under qemu")
    probe = ("import ctypes, numpy, tvm_ffi, importlib.util, pathlib; "
             "p = pathlib.Path(importlib.util.find_spec('tvm').submodule_search_locations[0]); "
             "ctypes.CDLL(str(p / 'lib' / 'libtvm_runtime.so'), mode=ctypes.RTLD_GLOBAL); print('ok')")
    out = run_in_rootfs(root, g, ["/usr/bin/python3", "-c", probe], timeout=600)
    if out.returncode != 0 or "ok" not in out.stdout:
        raise ToolchainError(f"The {g.debian} rootfs does not work: {last_line(out.stderr)}")


def _wheelhouse(g: GuestArch, say: Callable) -> Path:
    """Download the guest's wheels (with their dependencies) into a cache shared by rootfs builds."""
    house = cache_dir() / f"wheels-{g.arch}"
    house.mkdir(parents=True, exist_ok=True)
    say(f"downloading {g.arch} wheels into {house}")
    _run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", *_platform_args(g),
          "--python-version", PYTHON_VERSION, "--implementation", "cp", "-d", str(house), *wheel_requirements()],
         "pip download (guest wheels)")
    return house


def run_in_rootfs(root: Path, g: GuestArch, argv: Sequence[str], timeout: float,
                  env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` (guest paths) in the chroot through qemu, explicitly, so binfmt is not needed."""
    command, full_env = rootfs_command(root, g, argv, env)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=full_env, check=False)


def rootfs_command(root: Path, g: GuestArch, argv: Sequence[str],
                   env: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The host command line and environment that run ``argv`` (guest paths) in the chroot through qemu,
    for callers that start a long-lived guest process themselves (e.g. a TVM RPC server).  The chroot
    shares the host's network namespace, so a guest server on 127.0.0.1 is reachable from the host."""
    _require_root(f"Running {g.arch} code in the rootfs")
    qemu = f"/usr/bin/{g.qemu}"
    full_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/root", **(env or {})}
    if os.environ.get("QEMU_CPU"):  # qemu's own variable: emulate that CPU model (e.g. cortex-a53, no dotprod)
        full_env.setdefault("QEMU_CPU", os.environ["QEMU_CPU"])
    chroot = require("chroot", "coreutils")  # looked up on the host's PATH, not the guest's
    return [chroot, str(root), qemu, *argv], full_env


def _platform_args(g: GuestArch) -> list[str]:
    return [arg for tag in g.platforms() for arg in ("--platform", tag)]


def _run(argv: Sequence[str], what: str) -> None:
    out = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise ToolchainError(f"{what} failed (exit {out.returncode}): {last_line(out.stderr or out.stdout)}")


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive lock file: two processes never build the same rootfs at once."""
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _unmount_below(root: Path) -> None:
    """Unmount anything debootstrap left mounted inside ``root`` (deepest first) before moving it."""
    prefix = str(root.resolve())
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for point in sorted((m for m in mounts if m == prefix or m.startswith(prefix + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
