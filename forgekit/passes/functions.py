"""The loop every Relax mutator pass of forgekit shares: the mutator over each Relax function of a module; and
the wrapper that keeps a module whose optional TVM pass fails on it.

Why not TVM's: ``relax.transform.function_pass`` rewrites one function at a time with no builder shared
across them, and forgekit's mutators emit PrimFuncs (``call_te``) or read state of the whole module, which
needs one ``PyExprMutator`` (one ``BlockBuilder``) over all the functions.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

log = logging.getLogger("forgekit.passes")


def rewrite_functions(mutator: Any, mod: Any, *, each: Callable[[Any, Any], None] | None = None,
                      finalize: bool = False) -> Any:
    """``mutator`` (a ``PyExprMutator`` built on ``mod``) over every Relax function of ``mod``, each replaced in
    the mutator's builder; ``each(gv, func)`` runs before a function (to reset state kept per function);
    ``finalize``: the builder's ``finalize()`` (normalized, unused PrimFuncs dropped) instead of ``get()``."""
    from tvm import relax

    for gv, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            if each is not None:
                each(gv, func)
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.finalize() if finalize else mutator.builder_.get()


def or_keep(inner: Any, name: str, instead: str) -> Any:
    """The module pass ``inner`` as the pass ``name``, or the module unchanged where ``inner`` raises: for TVM
    passes that only make code faster and fail on some graphs.  ``instead`` says in the log what runs then."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name=name)
    def safe(mod: Any, _ctx: Any) -> Any:
        try:
            return inner(mod)
        except Exception as exc:  # noqa: BLE001 - TVM's own error types
            log.info("%s failed, %s: %s", name, instead, str(exc).strip().splitlines()[-1])
            return mod

    return safe
