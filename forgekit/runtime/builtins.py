"""Functions compiled models call that TVM registers from its Python package, not from a library.

NonZero and Unique have output shapes that depend on the data: TVM runs them as packed functions written in
Python (``tvm.relax.op.set``: numpy's ``nonzero`` and ``unique``), which ``import tvm.relax`` registers.  An
Engine runs without the compiler, and an artifact holding a NonZero could not be loaded ("Cannot find
ffi::Function relax.run.nonzero").  :func:`provide` registers TVM's own when the apache-tvm package is
installed (importing it takes seconds, once, and only for such an artifact), else forgekit's NonZero, the same
numpy call; Unique then gets one line saying what to install.  The C runtime has no Python: neither runs there.
"""

from __future__ import annotations

import importlib.util
import re
from typing import Any

from ..errors import ArtifactError

#: how the VM words a packed function it cannot find when it links a model
_MISSING = re.compile(r"Cannot find ffi::Function (relax\.run\.\w+)")


def missing_function(message: str) -> str | None:
    """The ``relax.run.*`` function a failed VM initialization could not find (None: another failure)."""
    found = _MISSING.search(message)
    return found[1] if found else None


def provide(name: str) -> None:
    """Register ``name`` for this process (see the module docstring); an ArtifactError when nothing can."""
    import tvm_ffi

    if importlib.util.find_spec("tvm") is not None:
        # registers TVM's relax.run.* functions; only where apache-tvm is installed (the runtime wheel's import
        # closure has no tvm: runtime/python/build_wheel.py checks the import statements)
        importlib.import_module("tvm.relax")

    if tvm_ffi.get_global_func(name, allow_missing=True) is not None:
        return
    if name == "relax.run.nonzero":
        tvm_ffi.register_global_func(name, _nonzero)
        return
    raise ArtifactError(f"This model calls {name}, which TVM implements in its Python package: install "
                        "apache-tvm next to the runtime (pip install forgekit), or run it in a process that "
                        "compiled it.")


def _nonzero(x: Any) -> Any:
    """TVM's ``relax.run.nonzero`` (tvm.relax.op.set.numpy_nonzero): the indices of the non-zero elements,
    [ndim, count] int64, in a 64-byte aligned tensor as TVM allocates (the kernels reading it assume that)."""
    import numpy as np
    import tvm_ffi

    from .loader import aligned_copy

    indices = np.stack(np.atleast_1d(np.from_dlpack(x)).nonzero(), axis=0).astype(np.int64)
    return tvm_ffi.from_dlpack(aligned_copy(np.ascontiguousarray(indices)))
