"""The TIDL offload plan: which ONNX nodes TI's import would put on the C7x/MMA, in which subgraphs, and why not the rest.

Partitioning as TI's import does it (its onnxruntime provider): every node is checked against TIDL's
operator table (:mod:`.tidl_rules`, per device) and the user's deny/allow lists; supported nodes that follow
each other in graph order form a subgraph; a subgraph whose inputs all come from one earlier subgraph joins
it; only the first ``max_num_subgraphs`` (at most 16) are kept, the nodes of the others stay on the Arm
cores; ``max_num_subgraph_nodes`` caps a subgraph's size.  Constant sub-graphs are folded first (TI's
model optimizer does), so they count in neither.  The plan states every node's place, the subgraph count
and the share of multiply-accumulates offloaded; :mod:`.tidl_driver` hands it to TI's tools as a
``deny_list:layer_name`` so their partition is this one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from ..errors import UsageError
from .tidl_graph import load_graph, macs
from .tidl_rules import check_node

MAX_SUBGRAPHS = 16
MAX_SUBGRAPH_NODES = 864  # TI's default advanced_options:max_num_subgraph_nodes


@dataclass(frozen=True)
class NodePlan:
    name: str
    op: str
    subgraph: int | None  # None: on the Arm cores
    reason: str | None
    macs: int


@dataclass(frozen=True)
class TidlPlan:
    target: str
    soc: str
    nodes: tuple[NodePlan, ...]
    folded: int
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def subgraph_count(self) -> int:
        return len({n.subgraph for n in self.nodes if n.subgraph is not None})

    @property
    def offloaded(self) -> list[NodePlan]:
        return [n for n in self.nodes if n.subgraph is not None]

    @property
    def on_arm(self) -> list[NodePlan]:
        return [n for n in self.nodes if n.subgraph is None]

    @property
    def macs_total(self) -> int:
        return sum(n.macs for n in self.nodes)

    @property
    def macs_share(self) -> float:
        total = self.macs_total
        return sum(n.macs for n in self.offloaded) / total if total else 0.0

    def deny_names(self) -> list[str]:
        """The nodes this plan keeps on the Arm cores, as TI's ``deny_list:layer_name`` takes them."""
        return [n.name for n in self.on_arm]

    def summary(self) -> list[str]:
        """A few lines for the terminal: the counts, then the reasons nodes stay on the Arm cores."""
        lines = [f"TIDL plan for {self.target} ({self.soc}): {len(self.offloaded)} of {len(self.nodes)} nodes in "
                 f"{self.subgraph_count} subgraph(s), {100 * self.macs_share:.1f}% of "
                 f"{self.macs_total / 1e6:.1f} M multiply-accumulates offloaded"]
        reasons: dict[str, list[NodePlan]] = {}
        for n in self.on_arm:
            reasons.setdefault(f"{n.op}: {n.reason}", []).append(n)
        for reason, nodes in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
            names = ", ".join(n.name for n in nodes[:3]) + (", ..." if len(nodes) > 3 else "")
            lines.append(f"  on the Arm cores: {len(nodes)} x {reason} ({names})")
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "soc": self.soc, "subgraph_count": self.subgraph_count,
                "nodes_offloaded": len(self.offloaded), "nodes": len(self.nodes), "constant_nodes_folded": self.folded,
                "macs_total": self.macs_total, "macs_offloaded_share": round(self.macs_share, 6),
                "options": self.options,
                "plan": [{"name": n.name, "op": n.op, "subgraph": n.subgraph, "reason": n.reason, "macs": n.macs}
                         for n in self.nodes]}


def _merge(groups: list[list[Any]], producer_group: dict[str, int], g: Any) -> list[list[Any]]:
    """Join every group whose variable inputs all come from one earlier group into it (TI's merge)."""
    changed = True
    while changed:
        changed = False
        for b in range(len(groups) - 1, 0, -1):
            sources = set()
            for node in groups[b]:
                for name in g.variable_inputs(node):
                    src = producer_group.get(name)
                    if src != b:
                        sources.add(src)  # None: a graph input or a node on the Arm cores
            if len(sources) == 1 and None not in sources and min(sources) < b:
                a = sources.pop()
                groups[a].extend(groups[b])
                for node in groups[b]:
                    for out in node.output:
                        producer_group[out] = a
                del groups[b]
                for name, gi in producer_group.items():
                    if gi > b:
                        producer_group[name] = gi - 1
                changed = True
                break
    return groups


def plan_tidl(model: Any, target: str, shape_dict: dict[str, list[int]] | None = None, *,
              deny_types: Sequence[str] = (), deny_names: Sequence[str] = (), allow_names: Sequence[str] | None = None,
              max_subgraphs: int = MAX_SUBGRAPHS, max_subgraph_nodes: int = MAX_SUBGRAPH_NODES) -> TidlPlan:
    """The TIDL plan of ``model`` (ModelProto or path) for the TI board ``target`` (``ti/am68a``)."""
    from ..importer.load import load_onnx
    from ..targets.ti import board

    ti = board(target)
    if ti is None or not ti.has_tidl:
        raise UsageError(f"TIDL offload needs a TI board with a C7x/MMA accelerator (ti/tda4vm, ti/am68a, ti/am69a, "
                         f"ti/am62a, ti/am67a), not '{target}'.")
    if not 1 <= max_subgraphs <= MAX_SUBGRAPHS:
        raise UsageError(f"max_num_subgraphs must be 1-{MAX_SUBGRAPHS} (TIDL's limit), not {max_subgraphs}.")
    onnx_model, _ = load_onnx(model)
    g = load_graph(onnx_model, shape_dict)
    denied_types, denied_names = set(deny_types), set(deny_names)
    reasons: dict[int, str | None] = {}
    for i, node in enumerate(g.nodes):
        name = g.node_name(node)
        if node.op_type in denied_types:
            reasons[i] = "denied by deny_list:layer_type"
        elif name in denied_names:
            reasons[i] = "denied by deny_list:layer_name"
        elif allow_names is not None and name not in allow_names:
            reasons[i] = "not in allow_list:layer_name"
        else:
            reasons[i] = check_node(node, g, ti.lacks)
    groups: list[list[Any]] = []
    producer_group: dict[str, int] = {}
    previous_supported = False
    for i, node in enumerate(g.nodes):
        if reasons[i] is not None:
            previous_supported = False
            continue
        if not previous_supported:
            groups.append([])
        groups[-1].append(node)
        for out in node.output:
            producer_group[out] = len(groups) - 1
        previous_supported = True
    groups = _merge(groups, producer_group, g)
    subgraph_of: dict[int, int] = {}  # id(node) -> subgraph
    over_limit: dict[int, str] = {}  # id(node) -> why a supported node stays on the Arm cores
    for gi, group in enumerate(groups):
        for k, node in enumerate(group):
            if gi >= max_subgraphs:
                over_limit[id(node)] = f"its subgraph ({gi}) is beyond max_num_subgraphs ({max_subgraphs})"
            elif k >= max_subgraph_nodes:
                over_limit[id(node)] = f"subgraph {gi} reached max_num_subgraph_nodes ({max_subgraph_nodes})"
            else:
                subgraph_of[id(node)] = gi
    nodes = tuple(NodePlan(g.node_name(n), n.op_type, subgraph_of.get(id(n)),
                           None if id(n) in subgraph_of else over_limit.get(id(n), reasons[i]), macs(n, g))
                  for i, n in enumerate(g.nodes))
    options = {"max_num_subgraphs": max_subgraphs, "max_num_subgraph_nodes": max_subgraph_nodes,
               "deny_list:layer_type": sorted(denied_types), "deny_list:layer_name": sorted(denied_names),
               "allow_list:layer_name": None if allow_names is None else sorted(allow_names)}
    return TidlPlan(target, f"{ti.soc}, TIDL SOC {ti.tidl_soc}", nodes, len(g.folded), options)
