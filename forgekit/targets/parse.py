"""Turn whatever a user calls a target into a :class:`TargetSpec`.

TVM 0.27 accepts only JSON dicts and its own tags; users (and Forge/tvmc scripts) write legacy strings
such as ``"llvm -mcpu=skylake -mattr=+avx2"`` or ``"cuda -arch=sm_86"``.  This module accepts all of:

* a forgekit tag (``raspberry-pi/5``) or a TVM tag (``nvidia/jetson-agx-orin-64gb``);
* ``host`` / ``native``: the CPU forgekit runs on, detected through LLVM;
* a legacy target string, a JSON string, a dict, or a ``tvm.target.Target``.

An unknown name raises :class:`~forgekit.errors.TargetError` that lists the closest valid names.
"""

from __future__ import annotations

import difflib
import json
import shlex
from dataclasses import dataclass, replace
from typing import Any

from ..errors import TargetError
from ..log import first_line
from ..runtime.cpu import host_arch, normalize_arch
from .host import check_llvm_cpu, detect_host, host_triple
from .tags import HOST_NAMES, TAGS
from .variants import baseline_target, level_names, portable_arch

# Options whose TVM type is Array<str>; a legacy string gives them comma-separated.
_LIST_OPTIONS = {"mattr", "keys", "libs", "cl-opt"}
# Legacy flags without a value that TVM 0.27 no longer has as target options.
_BUILD_FLAGS = {"system-lib"}


@dataclass(frozen=True)
class TargetSpec:
    """A resolved compilation target.

    Attributes
    ----------
    target:
        TVM target dict of the device code, without ``host`` and without TVM's derived ``feature.*``
        and ``tag`` keys (so it round-trips through ``tvm.target.Target`` and JSON).
    host:
        TVM target dict of the host code (``None`` when the target is a CPU and is its own host).
    name:
        What the user wrote, or the tag name (TVM drops tag names on export).
    family:
        ``x86``, ``arm``, ``armhf``, ``android``, ``cuda`` or ``other``: which toolchain links it.
    system_lib:
        The legacy ``-system-lib`` flag was given.
    levels:
        For a portable target (``x86-64``, bare ``llvm``, ``arm/aarch64``): the instruction-set levels
        built into the artifact (:mod:`forgekit.targets.variants`); ``target`` is then the baseline level.
    """

    target: dict[str, Any]
    host: dict[str, Any] | None = None
    name: str = ""
    family: str = "other"
    system_lib: bool = False
    levels: tuple[str, ...] = ()

    @property
    def host_family(self) -> str:
        """The family of the CPU code (the target's own for CPU targets, its host's for GPU targets)."""
        return self.family if self.is_cpu else _family_of(self.host_dict, None)

    @property
    def kind(self) -> str:
        return str(self.target["kind"])

    @property
    def is_cpu(self) -> bool:
        return self.kind in ("llvm", "c")

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def cuda_arch(self) -> str:
        """The GPU architecture (``sm_87``) the kernels are built for.

        TVM silently falls back to ``sm_50`` when none is given and no GPU is present; forgekit asks instead,
        because the build machine usually is not the deployment GPU.
        """
        arch = self.target.get("arch")
        if not arch:
            raise TargetError(f"Target '{self.name}' names no GPU architecture: add -arch=sm_XY (e.g. "
                              "'cuda -arch=sm_86') or use a tag such as cuda/sm_86 or jetson/orin.")
        return str(arch)

    @property
    def family_impl(self) -> Any:
        """The :class:`~forgekit.targets.families.base.Family` that links, describes and runs this target."""
        from .families import get_family

        return get_family(self.family)

    def host_tvm_target(self) -> Any:
        """The ``tvm.target.Target`` of the code that runs on the CPU."""
        import tvm

        return tvm.target.Target(self.host_dict)

    def cpu_features(self) -> list[str]:
        """The CPU features the artifact's CPU code may use: the running CPU must have them all."""
        from .isa import required_cpu_features

        return required_cpu_features(self.host_tvm_target())

    @property
    def host_dict(self) -> dict[str, Any]:
        """Target dict of the code that runs on the CPU (the target itself for CPU targets)."""
        return self.target if self.is_cpu else (self.host or {"kind": "llvm"})

    @property
    def triple(self) -> str:
        """LLVM triple of the CPU code; empty means "the machine compiling it"."""
        return str(self.host_dict.get("mtriple", ""))

    @property
    def arch(self) -> str:
        """CPU architecture of the artifact: ``x86_64``, ``aarch64``, ``arm``..."""
        triple = self.triple
        return normalize_arch(triple.split("-", 1)[0]) if triple else host_arch()

    @property
    def is_cross(self) -> bool:
        """True when the artifact cannot run on this machine."""
        return self.arch != host_arch()

    def tvm_target(self):
        """Build the ``tvm.target.Target`` (imports TVM)."""
        import tvm

        try:
            if self.is_cpu:
                return tvm.target.Target(self.target)
            return tvm.target.Target(self.target, host=self.host_dict)
        except Exception as exc:  # TVM raises its own error types for bad options
            raise TargetError(f"TVM rejected target {self.name or self.target}: {first_line(exc)}") from None

    def as_string(self) -> str:
        """Legacy one-line form, e.g. ``llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a76``."""
        return _to_string(self.target) + ("" if self.is_cpu or not self.host else f" (host: {_to_string(self.host)})")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description used in metadata."""
        return {"name": self.name, "family": self.family, "target": self.target, "host": self.host_dict,
                "triple": self.triple or host_triple(), "arch": self.arch, "levels": list(self.levels)}


def _to_string(d: dict[str, Any]) -> str:
    parts = [str(d["kind"])]
    for key, value in d.items():
        if key in ("kind", "host"):
            continue
        if isinstance(value, (list, tuple)):
            value = ",".join(map(str, value))
        elif isinstance(value, bool):
            value = str(value).lower()
        parts.append(f"-{key}={value}")
    return " ".join(parts)


def _kind_options(kind: str) -> dict[str, str]:
    import tvm

    try:
        return dict(tvm.target.TargetKind.options_from_name(kind))
    except Exception:
        return {}


def _known_kinds() -> list[str]:
    import tvm

    return list(tvm.target.Target.list_kinds())


def _tvm_tags() -> list[str]:
    import tvm

    return list(tvm.target.list_tags().keys())


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    """Drop the keys TVM derives itself so the dict is stable and re-parsable."""
    out = {}
    for key, value in d.items():
        if key == "tag" or key.startswith("feature."):
            continue
        if key == "keys" and tuple(value) in (("cpu",), ("arm_cpu", "cpu"), ("cuda", "gpu")):
            continue
        if isinstance(value, tuple):
            value = list(value)
        out[key] = value
    return out


def _family_of(target: dict[str, Any], host: dict[str, Any] | None) -> str:
    kind = target.get("kind")
    if kind == "cuda":
        return "cuda"
    triple = str(target.get("mtriple", ""))
    if "android" in triple:
        return "android"
    if triple.startswith(("aarch64", "arm64")):
        return "arm"
    if triple.startswith("arm"):
        return "armhf"
    if kind == "llvm" and not triple:  # TVM's default triple is the compiling machine's
        return {"x86_64": "x86", "aarch64": "arm"}.get(host_arch(), "other")
    if triple.startswith("x86_64"):
        return "x86"
    return "other"


def all_tag_names() -> list[str]:
    """Every name :func:`parse_target` accepts as a tag (forgekit's, ``host``, then TVM's)."""
    return [*TAGS, *HOST_NAMES, *_tvm_tags()]


def _unknown(text: str) -> TargetError:
    candidates = all_tag_names() + _known_kinds()
    close = difflib.get_close_matches(text, candidates, n=4, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    return TargetError(f"Unknown target '{text}'.{hint} Run 'forgekit targets' to list valid targets.")


def _parse_string(text: str) -> tuple[dict[str, Any], bool]:
    """Parse a legacy ``kind -opt=value ...`` string into a TVM dict."""
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise TargetError(f"Cannot parse target string '{text}': {exc}") from None
    kind, options = tokens[0], tokens[1:]
    if kind not in _known_kinds():
        raise _unknown(text)
    valid = _kind_options(kind)
    target: dict[str, Any] = {"kind": kind}
    system_lib = False
    for token in options:
        if not token.startswith("-"):
            raise TargetError(f"Cannot parse target option '{token}' in '{text}': options look like -key=value.")
        key, sep, value = token.lstrip("-").partition("=")
        if key in _BUILD_FLAGS:
            system_lib = value.lower() not in ("0", "false") if sep else True
            continue
        if key not in valid:
            close = difflib.get_close_matches(key, list(valid), n=3)
            hint = f" Did you mean: {', '.join('-' + c for c in close)}?" if close else ""
            raise TargetError(f"Unknown option '-{key}' for target kind '{kind}'.{hint}")
        target[key] = _coerce(key, value if sep else "true", valid[key])
    return target, system_lib


def _coerce(key: str, value: str, type_name: str) -> Any:
    if key in _LIST_OPTIONS or type_name.startswith("Array"):
        items = [v.strip() for v in value.split(",") if v.strip()]
        if key == "mattr":  # LEIP writes "-mattr=avx2,+avx512f": LLVM wants every feature signed
            items = [v if v[0] in "+-" else "+" + v for v in items]
        return items
    if type_name == "int":
        try:
            return int(value)
        except ValueError:
            raise TargetError(f"Target option -{key} takes an integer, got '{value}'.") from None
    if type_name == "bool":
        return value.lower() in ("1", "true", "yes", "on")
    return value


def parse_target(target: Any, host: Any = None) -> TargetSpec:
    """Resolve ``target`` (and an optional separate ``host``) into a :class:`TargetSpec`.

    Parameters
    ----------
    target:
        A forgekit or TVM tag, ``"host"``, a legacy string (``"llvm -mcpu=skylake"``), a JSON string,
        a dict, a ``tvm.target.Target`` or an existing :class:`TargetSpec`.
    host:
        The CPU target of a GPU target, in any of the same forms.  Ignored (must match) for CPU targets.

    Raises
    ------
    TargetError
        The target is unknown (the message names the closest valid ones) or TVM rejects an option.
    """
    if isinstance(target, TargetSpec) and host is None:
        return target
    name, system_lib, family, levels = "", False, None, ()
    tdict: dict[str, Any]
    if isinstance(target, TargetSpec):
        tdict, name, family, system_lib = dict(target.target), target.name, target.family, target.system_lib
        levels = target.levels
    elif isinstance(target, dict):
        tdict = dict(target)
    elif isinstance(target, str):
        text = target.strip()
        if not text:
            raise TargetError("Empty target: give a tag such as 'host' or 'raspberry-pi/5', or a string like 'llvm'.")
        name = text
        if text in TAGS:
            family, _, tdict = TAGS[text]
            tdict = json.loads(json.dumps(tdict))
        elif text in HOST_NAMES:
            tdict, family = detect_host(), None
        elif text.startswith("{"):
            try:
                tdict = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TargetError(f"Target JSON is invalid: {exc}") from None
            if not isinstance(tdict, dict):
                raise TargetError("Target JSON must be an object such as {\"kind\": \"llvm\"}.")
        elif text in _tvm_tags():
            import tvm

            tdict = _clean(dict(tvm.target.Target(text).export()))
        elif " " in text or text.split()[0] in _known_kinds():
            tdict, system_lib = _parse_string(text)
        else:
            raise _unknown(text)
    elif type(target).__name__ == "Target":
        tdict = _clean(dict(target.export()))
    else:
        raise TargetError(f"A target must be a string, dict or tvm Target, not {type(target).__name__}.")

    if "kind" not in tdict:
        raise TargetError(f"Target {tdict} has no 'kind' (e.g. \"llvm\" or \"cuda\").")
    if "system-lib" in tdict:
        system_lib = bool(tdict.pop("system-lib"))
    inner_host = tdict.pop("host", None)
    host_dict = None
    if host is not None:
        host_dict = parse_target(host).target
    elif inner_host is not None:
        host_dict = _clean(dict(inner_host)) if not isinstance(inner_host, str) else parse_target(inner_host).target
    tdict = _clean(tdict)
    spec = TargetSpec(
        target=tdict,
        host=None if tdict["kind"] in ("llvm", "c") else host_dict,
        name=name or _to_string(tdict),
        family=family or _family_of(tdict, host_dict),
        system_lib=system_lib,
    )
    portable = portable_arch(name, tdict, host_arch()) if spec.is_cpu and not levels else None
    if portable is not None:
        spec = replace(spec, target=baseline_target(portable, tdict), levels=level_names(portable))
    elif levels:
        spec = replace(spec, levels=levels)
    spec.tvm_target()  # validate every option now, with a one-line error
    check_llvm_cpu(spec.host_dict, spec.triple or host_triple())
    return spec
