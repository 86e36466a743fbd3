"""Backends: how a Relax module becomes machine code for a kind of device.

* :mod:`.cpu` — LLVM CPU targets: forgekit's schedule rules (opt level 3+), else TVM's default pipeline;
* :mod:`.cuda` — NVIDIA GPUs: DLight-scheduled kernels compiled by nvcc into a fatbin at build time.

:func:`.pipeline.lowering_pipeline` picks the Relax-to-VM pipeline for a target and level.
This ``__init__`` imports nothing: importing one backend never loads another.
"""

