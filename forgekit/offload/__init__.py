"""Accelerator offload: partitions for TensorRT and TI's TIDL, ONNX subgraphs, explicit-quantization (QDQ) export.

- :mod:`.partition`: partitions of a Relax module (list, flatten, measure, inline back)
- :mod:`.tensorrt`: TVM's TensorRT partitioner + a size filter, each region as a checked ONNX subgraph
- :mod:`.relax_onnx`: a partition as a standalone ONNX model
- :mod:`.mixin`: the façade's partition methods (Forge's ``partition_for_tensorrt``, ``inline_partitions``, ...)

Nothing here imports :mod:`forgekit.model` (the façade imports this package).
"""
