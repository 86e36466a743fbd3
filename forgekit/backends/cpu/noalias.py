"""Every kernel keeps its ``noalias`` in LLVM, whichever function of the module sorts last.

TVM 0.27's LLVM code generator decides a function's pointer aliasing from a member that the *declaration* of a
function sets (``CodeGenLLVM::DeclareFunctionInternal``: ``is_restricted_ = func has tirx.noalias``).
``AddFunctionsOrdered`` declares every function of the module first, in the order of their symbol names, and
only then generates their bodies, and the second lookup returns before that line: so every function is
generated with the ``tirx.noalias`` of the module's alphabetically last function.  The VM's shape function
(``shape_func``, from ``VMShapeLower``: any model with a dynamic dimension has one) is the one function of a
CPU build without the attribute.  Where it sorts last (no kernel named after it: no softmax, split, take,
transpose or Winograd kernel, as in an LSTM or GRU model with a dynamic length), no kernel of the library had
``noalias`` on its buffers, and LLVM reloaded and stored accumulators that it could otherwise keep in
registers around every multiply-add: a unidirectional LSTM's loop kernel (H=512, 40 steps, 2 threads, a Xeon)
took 1.68 ms built with its model's shape function and 1.12 ms without.

So the pass below gives ``tirx.noalias`` to each function that has at most one pointer parameter, where it
cannot be wrong (no second pointer to alias): the shape functions.  A function of several pointers without the
attribute is left as it is (none is built today; TVM would then give it the last function's status anyway).
"""

from __future__ import annotations

from typing import Any

NOALIAS = "tirx.noalias"


def _pointer_params(func: Any) -> int:
    from tvm import ir, tirx

    return sum(1 for p in func.params if isinstance(getattr(p, "ty", None), (ir.PointerType, tirx.BufferType)))


def noalias_where_trivial() -> Any:
    """The PrimFunc pass: ``tirx.noalias`` on functions of at most one pointer parameter that lack it."""
    from tvm import tirx

    def run(func: Any, _mod: Any, _ctx: Any) -> Any:
        attrs = func.attrs
        if (attrs is not None and NOALIAS in attrs) or _pointer_params(func) > 1:
            return func
        return func.with_attr(NOALIAS, True)

    return tirx.transform.prim_func_pass(run, opt_level=0, name="forgekit.NoAliasWhereTrivial")
