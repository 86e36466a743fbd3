"""TIDL offload at the façade's layer: plan -> split -> import, the Arm side as a :class:`forgekit.IRModule`.

The ONNX work (the plan, cutting each subgraph out, its converter) is :mod:`forgekit.offload.tidl` and
:mod:`forgekit.offload.tidl_partition`; this module only imports the rewritten model as a façade, which the
offload package, one layer below the façade, cannot.
"""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from ..offload.tidl import TidlPlan
from ..offload.tidl_partition import DOMAIN, OP, Subgraph, split, subgraph_converter
from .facade import IRModule


def import_arm_side(rewritten: Any) -> Any:
    """The rewritten model imported by forgekit (subgraphs as packed calls); a :class:`forgekit.IRModule`."""
    import onnx

    from ..importer.load import OnnxSource
    from ..importer.pipeline import import_source

    model = onnx.ModelProto()
    model.CopyFrom(rewritten)
    for node in model.graph.node:
        if node.domain == DOMAIN:
            # the importer's pre-flight knows the ONNX and onnxruntime domains only; no standard op is
            # called TidlSubgraph, so in the default domain it reaches the converter given here and no other
            node.domain = ""
    imported = import_source(OnnxSource(model, {}, None, {}, {}), extra_converters={OP: subgraph_converter()})
    return IRModule(imported.mod, input_names=[i.name for i in imported.inputs],
                    output_names=[o.name for o in imported.outputs])


def partition(model: Any, target: str, shape_dict: dict[str, list[int]] | None = None,
              **plan_options: Any) -> tuple[TidlPlan, Any, list[Subgraph]]:
    """plan -> split -> import: (the plan, the Arm side as a :class:`forgekit.IRModule`, the subgraphs)."""
    from ..importer.load import load_onnx
    from ..offload.tidl import plan_tidl

    proto, _ = load_onnx(model)
    plan = plan_tidl(proto, target, shape_dict, **plan_options)
    if not plan.subgraph_count:
        raise UsageError(f"Nothing of the model runs on TIDL for {target}: compile it without --offload.")
    rewritten, subgraphs = split(proto, plan, shape_dict)
    return plan, import_arm_side(rewritten), subgraphs
