"""Compilation targets: parsing, tags, and the families that link artifacts.

>>> spec = parse_target("llvm -mcpu=skylake -mattr=+avx2")      # doctest: +SKIP
>>> spec.target
{'kind': 'llvm', 'mcpu': 'skylake', 'mattr': ['+avx2']}
"""

from __future__ import annotations

from typing import Any

from .families import FAMILIES, get_family
from .host import detect_host
from .parse import TargetSpec, _family_of, parse_target
from .tags import HOST_NAMES, TAGS

_FAMILY_FILTERS = {
    "cuda": lambda fam, kind: fam == "cuda" or kind == "cuda",
    "x86": lambda fam, kind: fam == "x86",
    "arm": lambda fam, kind: fam in ("arm", "armhf"),
    "android": lambda fam, kind: fam == "android",
}


def _entries(family: str | None) -> list[tuple[str, str]]:
    """(tag, legacy target string) for forgekit's tags, then TVM's, filtered by family."""
    if family is not None and family not in _FAMILY_FILTERS:
        raise ValueError(f"Unknown family '{family}'. Choose from: {', '.join(_FAMILY_FILTERS)}.")
    rows: list[tuple[str, str]] = []
    for tag, (fam, _desc, tdict) in TAGS.items():
        if family is None or _FAMILY_FILTERS[family](fam, tdict["kind"]):
            rows.append((tag, TargetSpec(target={k: v for k, v in tdict.items() if k != "host"},
                                         host=tdict.get("host"), name=tag, family=fam).as_string()))
    import tvm

    for tag, tvm_target in tvm.target.list_tags().items():
        config = dict(tvm_target.export())
        kind = str(config.get("kind", ""))
        triple = str(config.get("mtriple", ""))
        fam = _family_of(config, None) if triple or kind == "cuda" else "other"
        if family is None or _FAMILY_FILTERS[family](fam, kind):
            rows.append((str(tag), f"{kind} (TVM tag)"))
    return rows


def list_target_tags(verbose: bool = False, family: str | None = None) -> list[Any]:
    """Every valid target tag: forgekit's first, then TVM's built-in ones.

    With ``verbose``, (tag, target string) pairs.  ``family`` is one of ``cuda``, ``x86``, ``arm``,
    ``android``.
    """
    rows = _entries(family)
    return rows if verbose else [tag for tag, _ in rows]


def list_cuda_tags(verbose: bool = False) -> list[Any]:
    """Tags of NVIDIA GPU targets (discrete GPUs and Jetson modules)."""
    return list_target_tags(verbose, "cuda")


def list_x86_tags(verbose: bool = False) -> list[Any]:
    """Tags of x86-64 CPU targets."""
    return list_target_tags(verbose, "x86")


def list_arm_tags(verbose: bool = False) -> list[Any]:
    """Tags of ARM Linux CPU targets (aarch64 and 32-bit armhf)."""
    return list_target_tags(verbose, "arm")


def list_android_tags(verbose: bool = False) -> list[Any]:
    """Tags of Android targets."""
    return list_target_tags(verbose, "android")


__all__ = [
    "FAMILIES",
    "HOST_NAMES",
    "TAGS",
    "TargetSpec",
    "detect_host",
    "get_family",
    "list_android_tags",
    "list_arm_tags",
    "list_cuda_tags",
    "list_target_tags",
    "list_x86_tags",
    "parse_target",
]
