"""The Arm side of a TIDL-offloaded model: each planned subgraph becomes one call out of the compiled model.

From a :class:`~forgekit.offload.tidl.TidlPlan`, every subgraph is cut out of the ONNX model as its own ONNX
model (``onnx.utils.Extractor``: what TI's import turns into ``*_tidl_net.bin``) and replaced in the model by
one ``forgekit.tidl::TidlSubgraph`` node; forgekit's importer turns that node (a converter given through its
``extra_converters`` hook) into ``R.call_dps_packed("forgekit.tidl.subgraph_<i>", inputs, out_ty)``, and the
rest of the model compiles as usual.  At run time those packed functions are TIDL-RT calls
(:class:`.tidl_rt.TidlRuntime`), registered before the VM starts.  :func:`forgekit.model.tidl.partition` runs
plan -> split -> import and gives the Arm side as a :class:`forgekit.IRModule`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from .tidl import TidlPlan

DOMAIN = "forgekit.tidl"
OP = "TidlSubgraph"


@dataclass(frozen=True)
class Subgraph:
    index: int
    model: Any  # the subgraph as a standalone ONNX model
    inputs: list[str]
    outputs: list[str]


def _io(nodes: list[Any], all_nodes: Any, graph_outputs: set[str], constants: set[str]) -> tuple[list, list]:
    """A subgraph's variable inputs, and its outputs that anything else reads (``all_nodes`` includes the
    folded Identity/Dropout nodes: one of them may be all that reads a subgraph's result)."""
    produced = {o for n in nodes for o in n.output}
    inside = {id(n) for n in nodes}
    inputs = list(dict.fromkeys(i for n in nodes for i in n.input if i and i not in produced and i not in constants))
    used_outside = {i for n in all_nodes if id(n) not in inside for i in n.input}
    outputs = [o for n in nodes for o in n.output if o in used_outside or o in graph_outputs]
    return inputs, outputs


def _toposort(nodes: list[Any], available: set[str]) -> list[Any]:
    ready, done, out = set(available), set(), []
    while len(out) < len(nodes):
        progressed = False
        for k, node in enumerate(nodes):
            if k not in done and all(not i or i in ready for i in node.input):
                out.append(node)
                ready.update(node.output)
                done.add(k)
                progressed = True
        if not progressed:
            raise ValueError("the offload partition would make a cycle")
    return out


def split(model: Any, plan: TidlPlan, shape_dict: dict[str, list[int]] | None = None) -> tuple[Any, list[Subgraph]]:
    """(the model with each subgraph replaced by one TidlSubgraph node, the subgraphs as ONNX models);
    ``shape_dict`` as given to :func:`~forgekit.offload.tidl.plan_tidl`."""
    import onnx
    from onnx import helper, utils

    from .tidl_graph import load_graph

    g = load_graph(model, shape_dict)  # shapes and constants as the plan saw them (inputs pinned as in the plan)
    where = {n.name: n.subgraph for n in plan.nodes}
    inferred = g.model
    graph_outputs = {o.name for o in inferred.graph.output} | set(g.outputs)
    groups: dict[int, list[Any]] = {}
    for node in g.nodes:
        index = where.get(g.node_name(node))
        if index is not None:
            groups.setdefault(index, []).append(node)
    extractor = utils.Extractor(inferred)
    subgraphs, replacement = [], []
    for index in sorted(groups):
        inputs, outputs = _io(groups[index], inferred.graph.node, graph_outputs, g.constants)
        shapes = [g.shape(o) for o in outputs]
        if any(s is None for s in shapes):  # the Arm side must allocate the subgraph's outputs: static shapes only
            unknown = [o for o, s in zip(outputs, shapes) if s is None]
            raise UsageError(f"TIDL subgraph {index}: the shape of {', '.join(unknown)} is unknown after shape "
                             "inference; pin the inputs (shape_dict) or deny the nodes that make it.")
        sub = extractor.extract_model(inputs, outputs)
        subgraphs.append(Subgraph(index, sub, inputs, outputs))
        dtypes = [onnx.helper.tensor_dtype_to_np_dtype(_elem_type(inferred, o)).name for o in outputs]
        replacement.append(helper.make_node(OP, inputs, outputs, domain=DOMAIN, name=f"tidl_subgraph_{index}",
                                            index=index, ranks=[len(s) for s in shapes],
                                            dims=[d for s in shapes for d in s], dtypes=dtypes))
    offloaded = {id(n) for nodes in groups.values() for n in nodes}
    kept = [n for n in inferred.graph.node if id(n) not in offloaded]
    available = {i.name for i in inferred.graph.input} | {t.name for t in inferred.graph.initializer}
    ordered = _toposort(kept + replacement, available)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(inferred)
    del rewritten.graph.node[:]
    rewritten.graph.node.extend(ordered)
    del rewritten.graph.value_info[:]
    rewritten.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return rewritten, subgraphs


def _elem_type(model: Any, name: str) -> int:
    for vi in [*model.graph.value_info, *model.graph.output, *model.graph.input]:
        if vi.name == name:
            return vi.type.tensor_type.elem_type
    return 1  # float


def subgraph_converter() -> type:
    """The importer's converter of ``forgekit.tidl::TidlSubgraph`` nodes (an ``extra_converters`` entry)."""
    from tvm import relax
    from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

    class TidlSubgraph(OnnxOpConverter):  # type: ignore[misc]
        """``forgekit.tidl::TidlSubgraph`` -> a destination-passing call of the subgraph's packed function."""

        @classmethod
        def _impl_v1(cls, bb: Any, inputs: Any, attr: dict[str, Any], params: Any) -> Any:
            ranks, dims = list(attr["ranks"]), list(attr["dims"])
            dtypes = [d.decode() if isinstance(d, bytes) else str(d) for d in attr["dtypes"]]
            types, at = [], 0
            for rank, dtype in zip(ranks, dtypes):
                types.append(relax.TensorType([int(d) for d in dims[at:at + rank]], dtype))
                at += rank
            func = relax.ExternFunc(f"forgekit.tidl.subgraph_{int(attr['index'])}")
            return relax.op.call_dps_packed(func, list(inputs), types[0] if len(types) == 1 else types)

    return TidlSubgraph


#: moved up to the façade's layer (they return a forgekit.IRModule, which this package sits below): the old
#: spelling still works, with a DeprecationWarning (tests/unit/test_architecture.py lists this alias)
_MOVED = {"import_arm_side": "forgekit.model.tidl", "partition": "forgekit.model.tidl"}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import warnings

    from ..model import tidl  # an import statement, so that tests/unit/test_architecture.py sees the edge

    warnings.warn(f"forgekit.offload.tidl_partition.{name} moved to {_MOVED[name]}.{name}; import it from there",
                  DeprecationWarning, stacklevel=2)
    return getattr(tidl, name)
