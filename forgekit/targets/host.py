"""The CPU forgekit runs on, as an LLVM target, and the check that a CPU target names what LLVM knows.

Split from :mod:`.parse` (which turns user text into targets) because both concern LLVM's view of a CPU, not
the syntax of a target string.
"""

from __future__ import annotations

import difflib
import os
from typing import Any

from ..errors import TargetError
from ..runtime.cpu import host_arch


def host_triple() -> str:
    return f"{host_arch()}-linux-gnu"


def detect_host() -> dict[str, Any]:
    """Target dict for the CPU forgekit runs on: LLVM's name for it and its core count."""
    from tvm.target import codegen  # noqa: PLC0415 - TVM is heavy; only the compiler needs it

    cpu = str(codegen.llvm_get_system_cpu())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    target: dict[str, Any] = {"kind": "llvm", "mtriple": host_triple(), "num-cores": cores}
    if cpu and cpu != "generic":
        target["mcpu"] = cpu
        mattr = host_mattr(cpu, target["mtriple"])
        if mattr:
            target["mattr"] = mattr
    return target


def host_mattr(cpu: str, mtriple: str) -> list[str]:
    """The ``-mattr`` that makes LLVM's name for this CPU what it executes (CPUID and the OS, as the runtime
    checks them): ``+`` the instruction-set extensions it runs that the name does not imply, ``-`` those the
    name implies that it lacks.  Only features the runtime can ask the CPU about are compared
    (:data:`.runtime.cpu.CODEGEN_FEATURES`), and nothing when it cannot ask at all.

    A virtual machine may report a CPUID model that LLVM maps to an older core: an Intel Xeon with
    AVX512-BF16, AVX512-FP16 and AVX-VNNI is ``rocketlake`` to LLVM, which has none of them, so a ``host``
    build lost the bf16 kernels and ``--precision bf16 -t host`` was refused ("host has none").  AMX is not
    added: LLVM emits it only from intrinsics, and an artifact would then require it for nothing.

    A virtual machine may also keep the host's model and mask features: an Intel Xeon VM whose hypervisor
    leaves AMX out (no CPUID bits, no XCR0 state) is ``emeraldrapids`` to LLVM, which implies AMX; every
    ``-t host`` artifact required amx-tile, amx-int8 and amx-bf16, and the runtime refused to load it on the
    machine that had just built it.  A VM that masks AVX-512 on a ``skylake-avx512`` host would have got
    AVX-512 code it cannot run.
    """
    import tvm

    from ..runtime.cpu import CODEGEN_FEATURES, host_features
    from .isa import llvm_features

    have = host_features()
    if not have:  # a CPU that cannot be asked: LLVM's name is all there is
        return []
    named = llvm_features(tvm.target.Target({"kind": "llvm", "mcpu": cpu, "mtriple": mtriple})) & CODEGEN_FEATURES
    unnamed = sorted(f for f in (have & CODEGEN_FEATURES) - named if not f.startswith("amx"))
    return [f"+{f}" for f in unnamed] + [f"-{f}" for f in sorted(named - have)]


def check_llvm_cpu(tdict: dict[str, Any], triple: str) -> None:
    """Refuse an ``-mcpu`` LLVM does not know for ``triple``, or an ``-mattr`` feature it does not know.

    LLVM itself only warns ("'notacpu' is not a recognized processor for this target") once per kernel and
    then builds generic code: a typo would silently cost all the speed the target was chosen for.
    """
    if tdict.get("kind") != "llvm":
        return
    import tvm
    from tvm.target import codegen

    from .. import log

    cpu = str(tdict.get("mcpu") or "")
    with log.quiet_native("target"):
        if cpu and not codegen.llvm_is_valid_cpu(cpu, triple):
            known = [str(c) for c in codegen.llvm_get_cpu_archlist(tvm.target.Target({"kind": "llvm",
                                                                                        "mtriple": triple}))]
            close = difflib.get_close_matches(cpu, known, n=4, cutoff=0.5)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise TargetError(f"Unknown CPU '{cpu}' for {triple.split('-')[0]}.{hint} Valid CPUs: "
                              f"{', '.join(sorted(known))}.")
        wanted = [str(a)[1:] for a in tdict.get("mattr") or [] if str(a).startswith("+")]
        if wanted:
            have = {str(f) for f in codegen.llvm_get_cpu_features(tvm.target.Target(
                {k: v for k, v in tdict.items() if k in ("kind", "mtriple", "mcpu", "mattr")} | {"mtriple": triple}))}
            unknown = [f for f in wanted if f not in have]
            if unknown:
                raise TargetError(f"Unknown CPU feature(s) {', '.join('+' + f for f in unknown)} for "
                                  f"{triple.split('-')[0]}: check the spelling (LLVM names, e.g. +avx2, +avx512f, "
                                  "+neon, +dotprod).")
