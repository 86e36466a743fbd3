"""Reshapes of symbolic shapes stay views.

TVM legalizes ``relax.reshape`` to a copy kernel (TOPI's) and ``RewriteDataflowReshape`` turns the copies it
can prove are reshapes back into views (``vm.builtin.reshape``, no data moved).  TOPI's index of the first
axis is taken modulo its extent; with a symbolic extent (a dynamic batch, width or sequence length) the
``% N`` is left in the kernel, so the proof fails: the reshape stayed a copy, and one TVM marks opaque, which
FuseOps fuses with nothing.  PP-OCRv6 rec with its width dynamic ran two such copies per call (0.2 ms of
~13); a static twin runs none.

Here a reshape whose shapes are not all static is left as ``relax.reshape``, which the VM lowering makes a
view (:data:`tvm.relax.transform.VMBuiltinLower`); static ones keep TVM's legalization, so that FuseOps still
fuses them into their neighbours' kernels.
"""

from __future__ import annotations

from typing import Any


def _static(shape: Any) -> bool:
    from tvm import tirx

    values = getattr(shape, "values", None)
    return values is not None and all(isinstance(v, (int, tirx.IntImm)) for v in values)


def legalize_reshape(bb: Any, call: Any) -> Any:
    """TVM's legalization of a static reshape; a symbolic one returned as it is (LegalizeOps keeps it)."""
    import tvm

    if _static(call.args[0].ty.shape) and _static(call.ty.shape):
        return tvm.ir.Op.get("relax.reshape").get_attr("FLegalize")(bb, call)
    return call
