"""Backends: how a Relax module becomes machine code for a kind of device, one package per kind.

* :mod:`.cpu` — LLVM CPU targets: forgekit's schedule rules (opt level 3+), else TVM's default pipeline;
* :mod:`.cuda` — NVIDIA GPUs: DLight-scheduled kernels compiled by nvcc into a fatbin at build time.

Each kind's ``pipeline.py`` writes out its whole lowering, phase by phase; :mod:`.pipeline` picks it by the
target's kind, and :mod:`.link` links the executables with the family's linker plus the kind's own part.
This ``__init__`` imports nothing: importing one backend never loads another.
"""
