"""Accelerator offload: partitions for TensorRT and TI's TIDL, ONNX subgraphs, explicit-quantization (QDQ) export.

- :mod:`.partition`: partitions of a Relax module (list, flatten, measure, inline back)
- :mod:`.tensorrt`: TVM's TensorRT partitioner + a size filter, each region as a checked ONNX subgraph
- :mod:`.relax_onnx`: a partition as a standalone ONNX model
- :mod:`.mixin`: the façade's partition methods (Forge's ``partition_for_tensorrt``, ``inline_partitions``, ...)

Nothing here imports :mod:`forgekit.model` (the façade imports this package): what builds a façade from offload's
results is there (``ONNXModule``: :mod:`forgekit.model.onnx_module`; the TIDL Arm side: :mod:`forgekit.model.tidl`),
but for the deprecated alias ``forgekit.offload.tidl_partition.partition``.
"""
