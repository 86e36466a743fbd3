"""The CPU backend: forgekit's default schedules for TVM 0.27 Relax modules, applied without measuring.

TVM 0.27's default Relax CPU pipeline fuses operators but never schedules their loops, so its output runs
10-40x slower than onnxruntime.  This package is the CPU counterpart of ``tvm.s_tir.dlight``, and
:mod:`.pipeline` is its whole pass order, phase by phase: a Relax prefix (canonicalization, numpy constant
folding, NHWC layout: :mod:`forgekit.passes`),
weights packed at compile time and polynomial ``exp``/``erf``/``tanh`` (:mod:`.packed_conv`, :mod:`.int8`,
:mod:`.fast_math`), then schedule *rules* (:mod:`.rules`: conv2d, matmul, int8 dot products, pool, row
reductions, elementwise, a fallback) applied to every fused PrimFunc for the target's vector ISA::

    from forgekit.backends import cpu
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
    ex = tvm.compile(mod, target=target, relax_pipeline=cpu.cpu_pipeline(target))

Adding a rule is one file: a :class:`~.rules.base.ScheduleRule` subclass inserted into
:data:`~.rules.RULES`.  ``FORGEKIT_SCHED_DEBUG=1`` logs the rule chosen for each function.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ApplyRules", "RULES", "STATS", "cpu_pipeline", "fusion_passes", "preprocess"]
_LAZY = {"ApplyRules": ".registry", "STATS": ".registry", "RULES": ".rules", "cpu_pipeline": ".pipeline",
         "fusion_passes": ".pipeline", "preprocess": ".pipeline"}


def __getattr__(name: str) -> Any:
    """The rule registry, its pass and the pipeline (:mod:`.pipeline`), loaded (with TVM) on first use."""
    if name not in _LAZY:
        raise AttributeError(f"module 'forgekit.backends.cpu' has no attribute '{name}'")
    return getattr(importlib.import_module(_LAZY[name], __name__), name)
