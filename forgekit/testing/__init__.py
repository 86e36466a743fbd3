"""Differential testing of forgekit against onnxruntime (NNSmith-style, offline).

* :mod:`.graphgen` — ``generate(seed)``: random valid ONNX graphs (static or with symbolic dims), built with
  :mod:`.graph` (dims, values, the builder) from the op generators of :mod:`.ops_math`, :mod:`.ops_shape` and
  :mod:`.ops_nn`.
* :mod:`.differential` — ``check(graph)``: compile at every opt level, compare with onnxruntime,
  classify failures into stable class strings; the compiling happens in :mod:`.worker`'s child process.
* :mod:`.shrink` — ``shrink(model, still_fails)``: delta-debugging down to a minimal failing model.

``bench/fuzz_onnx.py`` drives the three; ``tests/unit/test_fuzz.py`` runs a fixed slice.  Only forgekit's
public API is used (``forgekit.from_onnx``, ``get_inference_function``, ``calibrate``/``quantize`` and
``forgekit.errors``).
"""

from __future__ import annotations

from .graph import GeneratedGraph, feeds_for
from .graphgen import generate

__all__ = ["GeneratedGraph", "feeds_for", "generate"]
