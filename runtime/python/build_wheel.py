"""Build the ``forgekit-runtime`` wheel: forgekit's Engine and libtvm_runtime.so, no TVM compiler.

The wheel holds the same files as the full package under the same import names (``forgekit.runtime``,
``forgekit.crypto``, ``forgekit.artifact.layout``, ``forgekit.errors``, ...): the import closure of
``forgekit.runtime``, computed from the sources' import statements, so there is one Engine and nothing
is copied by hand.  The build fails when that closure imports anything but the standard library and the
declared dependencies (``tvm`` above all).  ``libtvm_runtime.so`` (3.4 MB) and the platform tag come from
an apache-tvm wheel: the installed one by default, or ``--tvm-wheel`` for another architecture::

    .venv/bin/python runtime/python/build_wheel.py -o dist/
    pip download apache-tvm==0.27.0.post1 --no-deps --only-binary=:all: --platform manylinux2014_aarch64 -d /tmp/tvm
    .venv/bin/python runtime/python/build_wheel.py -o dist/ --tvm-wheel /tmp/tvm/apache_tvm-*aarch64.whl

The module is also this folder's PEP 517 backend (``pip wheel runtime/python --no-build-isolation``; with
build isolation set ``FORGEKIT_TVM_WHEEL`` or ``--config-settings tvm-wheel=PATH``).
"""

from __future__ import annotations

import argparse
import ast
import base64
import hashlib
import importlib.metadata
import io
import os
import re
import sys
import time
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]  # the repository: forgekit/ lives here
RUNTIME_LIBRARY = "libtvm_runtime.so"
LIBRARY_DEST = "forgekit/runtime/lib/" + RUNTIME_LIBRARY  # where forgekit.runtime.loader looks first
TVM_LIBRARY = "tvm/lib/" + RUNTIME_LIBRARY
# TVM's CUDA runtime (0.4 MB): what runs a CUDA artifact's kernels (forgekit.runtime.device loads it only for
# those).  It links libcudart.so.13, which the `cuda` extra brings (NVIDIA's wheel) and a CUDA machine may
# have already; the driver's libcuda.so.1 comes with the driver.
CUDA_LIBRARY = "libtvm_runtime_cuda.so"
EXTRA_LIBRARY = "libtvm_runtime_extra.so"  # tvm.contrib.sort (TopK, Sort): forgekit.runtime.loader loads it
TVM_EXTRA_LIBRARY = "tvm/lib/" + EXTRA_LIBRARY
EXTRA_DEST = "forgekit/runtime/lib/" + EXTRA_LIBRARY
TVM_CUDA_LIBRARY = "tvm/lib/" + CUDA_LIBRARY
CUDA_DEST = "forgekit/runtime/lib/" + CUDA_LIBRARY
TVM_LICENSES = ("tvm/LICENSE", "tvm/NOTICE")  # Apache-2.0 asks redistributions to carry both
# ELF e_machine of each wheel architecture: a tag that lies about the library's machine fails the build.
ELF_MACHINES = {"x86_64": 62, "aarch64": 183}


class BuildError(Exception):
    """The wheel cannot be built as asked (one line)."""


@dataclass(frozen=True)
class TvmSource:
    """``libtvm_runtime.so`` and what describes it, from an installed or a downloaded apache-tvm wheel."""

    version: str
    tags: tuple[str, ...]  # the apache-tvm wheel's tags, e.g. py3-none-manylinux_2_28_x86_64
    library: bytes
    licenses: dict[str, bytes]
    cuda_library: bytes | None = None  # absent from TVM wheels built without CUDA
    extra_library: bytes | None = None


def config() -> dict:
    """``[project]`` and ``[tool.forgekit-runtime]`` of this folder's pyproject.toml."""
    data = tomllib.loads((HERE / "pyproject.toml").read_text())
    return {"project": data["project"], **data["tool"]["forgekit-runtime"]}


def version() -> str:
    """``forgekit.__version__``, read without importing forgekit."""
    match = re.search(r'^__version__ = "([^"]+)"', (ROOT / "forgekit" / "__init__.py").read_text(), re.M)
    if not match:
        raise BuildError("forgekit/__init__.py has no __version__ line")
    return match.group(1)


# ---------------------------------------------------------------------------------------- import closure
def _module_file(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _imports(name: str, path: Path) -> tuple[set[str], set[str]]:
    """(forgekit modules, third-party top-level names) that module ``name`` imports anywhere in its body,
    function-level imports included: they run when the Engine does."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    internal: set[str] = set()
    external: set[str] = set()

    def add(module: str) -> None:
        top = module.partition(".")[0]
        if top == "forgekit":
            internal.add(module)
        elif top not in sys.stdlib_module_names and top != "__future__":
            external.add(top)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            add(module)
            for alias in node.names:  # `from .. import crypto` imports the module forgekit.crypto
                if module.startswith("forgekit") and _module_file(f"{module}.{alias.name}"):
                    internal.add(f"{module}.{alias.name}")
    return internal, external


def closure(roots: list[str], allowed: list[str]) -> list[Path]:
    """Files of the roots' packages and of every forgekit module they import, with parent packages."""
    pending = []
    for root in roots:
        folder = ROOT.joinpath(*root.split("."))
        pending += [f"{root}.{p.stem}" if p.stem != "__init__" else root for p in sorted(folder.glob("*.py"))]
    seen: dict[str, Path] = {}
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        path = _module_file(name)
        if path is None:
            raise BuildError(f"module {name} is imported by the runtime but has no source file")
        seen[name] = path
        internal, external = _imports(name, path)
        illegal = sorted(external - set(allowed))
        if illegal:
            raise BuildError(f"{path.relative_to(ROOT)} imports {', '.join(illegal)}: the runtime wheel may only "
                             f"need the standard library and {', '.join(allowed)}")
        parts = name.split(".")
        pending += internal | {".".join(parts[:i]) for i in range(1, len(parts))}
    return sorted(seen.values())


# ---------------------------------------------------------------------------------------- apache-tvm
def tvm_from_installed() -> TvmSource:
    try:
        dist = importlib.metadata.distribution("apache-tvm")
    except importlib.metadata.PackageNotFoundError:
        raise BuildError("apache-tvm is not installed here: run with the forgekit venv's python, or pass "
                         "--tvm-wheel (FORGEKIT_TVM_WHEEL)") from None
    wheel = dist.read_text("WHEEL") or ""
    read = lambda rel: Path(dist.locate_file(rel)).read_bytes()  # noqa: E731
    cuda, extra = Path(dist.locate_file(TVM_CUDA_LIBRARY)), Path(dist.locate_file(TVM_EXTRA_LIBRARY))
    return TvmSource(dist.version, _tags(wheel), read(TVM_LIBRARY),
                     {rel: read(rel) for rel in TVM_LICENSES if Path(dist.locate_file(rel)).is_file()},
                     cuda.read_bytes() if cuda.is_file() else None, extra.read_bytes() if extra.is_file() else None)


def tvm_from_wheel(path: Path) -> TvmSource:
    if not path.is_file():
        raise BuildError(f"apache-tvm wheel '{path}' does not exist")
    with zipfile.ZipFile(path) as wheel:
        names = set(wheel.namelist())
        info = next((m for n in names if (m := re.fullmatch(r"apache_tvm-([^/]+)\.dist-info/WHEEL", n))), None)
        if info is None or TVM_LIBRARY not in names:
            raise BuildError(f"'{path.name}' is not an apache-tvm wheel (no {TVM_LIBRARY})")
        return TvmSource(info.group(1), _tags(wheel.read(info.group(0)).decode()), wheel.read(TVM_LIBRARY),
                         {rel: wheel.read(rel) for rel in TVM_LICENSES if rel in names},
                         wheel.read(TVM_CUDA_LIBRARY) if TVM_CUDA_LIBRARY in names else None,
                         wheel.read(TVM_EXTRA_LIBRARY) if TVM_EXTRA_LIBRARY in names else None)


def _tags(wheel_file: str) -> tuple[str, ...]:
    return tuple(line.split(":", 1)[1].strip() for line in wheel_file.splitlines() if line.startswith("Tag:"))


def platform_tag(source: TvmSource) -> str:
    """The apache-tvm wheel's platform tags (same glibc floor, same architecture), compressed."""
    platforms = sorted({tag.split("-")[2] for tag in source.tags})
    arches = {p.rpartition("_")[2] if not p.endswith("x86_64") else "x86_64" for p in platforms}
    if not platforms or len(arches) != 1 or not all(p.startswith("manylinux") for p in platforms):
        raise BuildError(f"apache-tvm's wheel tags {list(source.tags)} are not one manylinux architecture")
    arch = arches.pop()
    machine = int.from_bytes(source.library[18:20], "little") if source.library[:4] == b"\x7fELF" else None
    if machine != ELF_MACHINES.get(arch):
        raise BuildError(f"{RUNTIME_LIBRARY} (ELF machine {machine}) does not match the wheel tag's {arch}")
    return ".".join(platforms)


# ---------------------------------------------------------------------------------------- the wheel
def _metadata(project: dict, version_: str, tvm_version: str) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {project['name']}", f"Version: {version_}",
             f"Summary: {project['description']}", f"License: {project['license']}",
             f"Requires-Python: {project['requires-python']}"]
    lines += [f"Requires-Dist: {dep}" for dep in project["dependencies"]]
    for extra, deps in project.get("optional-dependencies", {}).items():
        lines += [f"Provides-Extra: {extra}"] + [f'Requires-Dist: {dep}; extra == "{extra}"' for dep in deps]
    body = (f"forgekit's deployment runtime: `from forgekit.runtime import Engine` loads a forgekit artifact "
            f"(plain or encrypted), reads its metadata, runs and benchmarks it.  It carries libtvm_runtime.so "
            f"and libtvm_runtime_cuda.so from apache-tvm {tvm_version} and needs no TVM compiler.  CUDA "
            f"artifacts: `pip install 'forgekit-runtime[cuda]'` (NVIDIA's CUDA runtime) and an NVIDIA driver.\n")
    return "\n".join(lines + ["Description-Content-Type: text/markdown", "", body])


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build(output: Path, tvm_wheel: Path | None = None) -> Path:
    """Write the wheel into ``output``; returns its path."""
    cfg = config()
    project, version_ = cfg["project"], version()
    source = tvm_from_wheel(tvm_wheel) if tvm_wheel else tvm_from_installed()
    if source.version != cfg["apache-tvm"]:
        raise BuildError(f"apache-tvm {source.version} given; forgekit compiles with {cfg['apache-tvm']} and "
                         "an artifact needs that runtime")
    tag = f"py3-none-{platform_tag(source)}"
    dist_info = f"forgekit_runtime-{version_}.dist-info"
    files = {p.relative_to(ROOT).as_posix(): p.read_bytes() for p in closure(cfg["roots"], cfg["allowed-imports"])}
    files[LIBRARY_DEST] = source.library
    if source.cuda_library is not None:
        files[CUDA_DEST] = source.cuda_library
    if source.extra_library is not None:
        files[EXTRA_DEST] = source.extra_library
    files.update({f"{dist_info}/licenses/{rel}": data for rel, data in source.licenses.items()})
    files[f"{dist_info}/METADATA"] = _metadata(project, version_, source.version).encode()
    files[f"{dist_info}/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: forgekit runtime/python/build_wheel.py\n"
                                   f"Root-Is-Purelib: false\n"
                                   + "".join(f"Tag: py3-none-{p}\n" for p in tag.split("-")[2].split("."))).encode()
    record = f"{dist_info}/RECORD"
    files[record] = ("\n".join([_record_line(n, d) for n, d in files.items()] + [f"{record},,", ""])).encode()
    # Reproducible: fixed timestamps (SOURCE_DATE_EPOCH when set), sorted entries but RECORD last.
    stamp = time.gmtime(max(int(os.environ.get("SOURCE_DATE_EPOCH", 315532800)), 315532800))[:6]
    output.mkdir(parents=True, exist_ok=True)
    path = output / f"forgekit_runtime-{version_}-{tag}.whl"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as wheel:
        for name in sorted(files, key=lambda n: (n == record, n)):
            info = zipfile.ZipInfo(name, stamp)
            info.external_attr = (0o100755 if name.endswith(".so") else 0o100644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, files[name])
    path.write_bytes(buffer.getvalue())
    return path


# ---------------------------------------------------------------------------------------- PEP 517
def _backend_tvm_wheel(config_settings: dict | None) -> Path | None:
    value = (config_settings or {}).get("tvm-wheel") or os.environ.get("FORGEKIT_TVM_WHEEL")
    return Path(value) if value else None


def build_wheel(wheel_directory: str, config_settings: dict | None = None,
                metadata_directory: str | None = None) -> str:
    return build(Path(wheel_directory), _backend_tvm_wheel(config_settings)).name


def get_requires_for_build_wheel(config_settings: dict | None = None) -> list[str]:
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", type=Path, default=ROOT / "dist", help="folder for the wheel (dist/)")
    parser.add_argument("--tvm-wheel", type=Path, help="apache-tvm wheel to take libtvm_runtime.so and the "
                        "platform tag from (default: the installed apache-tvm)")
    args = parser.parse_args(argv)
    try:
        path = build(args.output, args.tvm_wheel)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
