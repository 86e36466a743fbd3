"""The model façade: :class:`IRModule` (Forge's ``RelayModule``), :func:`from_onnx`, :func:`compile_model`.

:mod:`.facade` (state, introspection, identity, build and compile), :mod:`.quantization` (calibrate,
quantize, accuracy report), :mod:`.graph` (pure functions on a Relax module); :mod:`.onnx_module` (Forge's
``ONNXModule``) and :mod:`.tidl` (a TIDL-offloaded model's Arm side) build façades from what
:mod:`forgekit.offload` (one layer below) produces.
"""

from __future__ import annotations

from .facade import IRModule, RelayModule, compile_model, from_onnx

__all__ = ["IRModule", "RelayModule", "compile_model", "from_onnx"]
