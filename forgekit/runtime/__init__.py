"""The deployment runtime: load an artifact and run it, without the TVM compiler.

``from forgekit.runtime import Engine`` needs ``apache-tvm-ffi``, numpy and ``libtvm_runtime.so`` only
(``cryptography`` for encrypted artifacts).  Modules: :mod:`.engine` (``Engine``), :mod:`.loader`
(the runtime library, aligned buffers), :mod:`.memload` (loading decrypted code from memory),
:mod:`.compat` and :mod:`.cpu` (can this CPU run the artifact), :mod:`.inputs`, :mod:`.stats`.
"""

from __future__ import annotations

from .engine import Engine
from .inputs import example_inputs
from .loader import aligned_copy, ensure_runtime

__all__ = ["Engine", "aligned_copy", "ensure_runtime", "example_inputs"]
