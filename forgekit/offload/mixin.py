"""The partition half of the façade (Forge's ``RelayModule``): graphs, TensorRT partitions, inlining them back.

Forge partitions a module for TensorRT (``partition_for_tensorrt``; ``RelayModule(..., inline_partitions=True)``
undoes it) and reports ``is_tensorrt``, ``subgraph_count`` and ``graph_count``; its module also offers
``graphs``, ``main``, ``output_node`` and iteration over its graphs.  Here a graph is a Relax function of the
module: ``main`` and one per partition.  The work is in :mod:`.tensorrt` and :mod:`.partition`; this class
holds no state of its own (the façade's ``_mod``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from . import partition as _partition
from . import tensorrt as _tensorrt


class PartitionMixin:
    """What :class:`forgekit.IRModule` offers for offloaded partitions."""

    _mod: Any

    # ------------------------------------------------------------------ graphs
    @property
    def graphs(self) -> dict[str, Any]:
        """Every Relax function of the module by name: ``main`` first, then one per partition."""
        from tvm import relax

        funcs = {gv.name_hint: f for gv, f in self._mod.functions.items() if isinstance(f, relax.Function)}
        return {"main": funcs.pop("main"), **dict(sorted(funcs.items()))} if "main" in funcs else funcs

    @property
    def main(self) -> Any:
        """The module's ``main`` Relax function (the model's entry)."""
        return self._mod["main"]

    @property
    def output_node(self) -> Any:
        """The expression ``main`` returns (a variable bound in its last block; a tuple for several outputs)."""
        return self._mod["main"].body.body

    def __iter__(self) -> Iterator[str]:
        """The names of :attr:`graphs`, ``main`` first."""
        return iter(self.graphs)

    @property
    def graph_count(self) -> int:
        """Number of Relax functions (graphs) in the module: 1 for a plain model, 1 + partitions after offload."""
        return len(self.graphs)

    # ------------------------------------------------------------------ partitions
    @property
    def subgraph_count(self) -> int:
        """Number of sub-graphs offloaded to an external codegen (BYOC); 0 without offload."""
        return len(_partition.codegen_functions(self._mod))

    @property
    def is_tensorrt(self) -> bool:
        """True after :meth:`partition_for_tensorrt` found at least one region for TensorRT."""
        return _tensorrt.is_tensorrt(self._mod)

    @property
    def partitions(self) -> list[_partition.Partition]:
        """Each offloaded sub-graph: name, codegen, operators, multiply-accumulates, input/output shapes."""
        return _partition.describe(self._mod)

    def partition_for_tensorrt(self, min_ops: int = _tensorrt.DEFAULT_MIN_OPS,
                               min_macs: int = _tensorrt.DEFAULT_MIN_MACS) -> Any:
        """Put the regions TensorRT supports into ``Codegen: "tensorrt"`` sub-graphs, in place; returns ``self``.

        TVM's TensorRT partitioner, keeping regions of at least ``min_ops`` operators and ``min_macs``
        multiply-accumulates (smaller ones cost more in copies than they gain).  No TensorRT engine is built
        (this TVM build has no TensorRT runtime): :meth:`export_subgraphs` writes each region as ONNX, and
        :meth:`compile` for a CPU compiles the regions with the rest of the model.
        """
        self._mod = _tensorrt.partition_for_tensorrt(self._mod, min_ops=min_ops, min_macs=min_macs)
        return self

    def inline_partitions(self) -> Any:
        """Put every partition back into ``main``, in place (structurally the module before partitioning)."""
        self._mod = _partition.inline_partitions(self._mod)
        return self

    def export_subgraphs(self, folder: str | Path) -> list[Path]:
        """Each partition as a standalone ONNX model in ``folder`` (+ ``partitions.json``); returns the paths."""
        return _tensorrt.export_subgraphs(self._mod, folder)

    def check_subgraphs(self, seed: int = 0) -> list[_tensorrt.SubgraphCheck]:
        """Each exported partition run in onnxruntime against TVM's result for it (seeded inputs)."""
        return _tensorrt.check_subgraphs(self._mod, seed)

    def _buildable(self) -> Any:
        """The module a CPU or CUDA build takes: partitions compiled with the rest (no TensorRT runtime here)."""
        return _partition.inline_partitions(self._mod)
