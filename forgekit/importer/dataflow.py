"""Dataflow blocks around control flow: the pure bindings of a model with an ``If`` or a ``Loop``, in blocks that
the fusion passes see.

The frontend builds ``main`` as one dataflow block, except where the graph holds control flow: then every binding
is a plain one, and TVM's ``FuseOps`` fuses inside dataflow blocks only.  openWakeWord's "hey jarvis" classifier
(two MLPs of Gemm + LayerNorm + ReLU, then an ``If`` on the first one's score) ran each of its ~60 operators as a
kernel of its own with its own allocation: 66 us per call against 48 us as dataflow (its fused form; 2 threads,
this machine under load), a third of it in ``alloc_tensor``.  ``relax.transform.ConvertToDataflow`` puts every run
of pure bindings (branch bodies and Loop bodies too) in a dataflow block; the stepped-size quotients of
``--dynamic H=32..2048:32`` stay in their plain prologue (:func:`.strides.restore_quotient_prologue`, as the
calibration's rewrite does).
"""

from __future__ import annotations

from typing import Any

from .strides import restore_quotient_prologue


def has_control_flow(mod: Any) -> bool:
    """Whether a Relax function of ``mod`` holds an ``If`` (a Loop imports as a recursive function with one)."""
    from tvm import relax

    found: list[Any] = []

    def visit(expr: Any) -> None:
        if isinstance(expr, relax.If):
            found.append(expr)

    for _gv, func in mod.functions_items():
        if isinstance(func, relax.Function) and not found:
            relax.analysis.post_order_visit(func, visit)
    return bool(found)


def dataflow_around_control_flow(mod: Any) -> Any:
    """``mod`` with the pure bindings around its control flow in dataflow blocks (unchanged without control flow:
    the frontend's single dataflow block is already there)."""
    from tvm import relax

    if not has_control_flow(mod):
        return mod
    return restore_quotient_prologue(relax.transform.ConvertToDataflow()(mod))
