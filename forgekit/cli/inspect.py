"""``forgekit inspect``: a model's inputs, outputs, operators, hash and fingerprint, or what blocks import."""

from __future__ import annotations

import os
from typing import Annotated, Any, Optional

import typer

from .app import app, command, old_spellings
from .options import DynamicOpt, FreezeOpt, InputPathOpt, ModelArg, ShapeOpt, fmt_shape, model_arg
from .options import parse_dynamic, parse_freeze, parse_shapes, write_json


def json_flag(args: list[str]) -> list[str]:
    """``--json`` with no value after it is ``--json -`` (standard output).

    ``inspect --json`` was a flag that printed JSON from the first release until ``--json`` took a FILE;
    scripts that still wrote ``inspect MODEL --json`` or ``--json --check`` then failed with exit 2 (or wrote
    a file named ``--check``).  A value is a following word that is not an option (``-`` is stdout)."""
    out = []
    for i, arg in enumerate(args):
        out.append(arg)
        if arg == "--json" and (i + 1 == len(args) or (args[i + 1].startswith("-") and args[i + 1] != "-")):
            out.append("-")
    return out


JsonOpt = Annotated[Optional[str], typer.Option("--json", metavar="[FILE]", help="Also write the result as JSON to "
                                                "FILE; without FILE (or '-'): to standard output only.")]


@app.command(cls=old_spellings(json_flag))
@command
def inspect(
    model: ModelArg = None,
    input_path: InputPathOpt = None,
    json_out: JsonOpt = None,
    input_shape: ShapeOpt = None,
    dynamic: DynamicOpt = None,
    freeze: FreezeOpt = None,
    check: Annotated[bool, typer.Option(
        "--check", help="Only check that the model imports: every unsupported operator (with node names), "
                        "every input that stays dynamic, and the import itself.")] = False,
) -> None:
    """Show a model's inputs, outputs, operators, hash and fingerprint."""
    from ..model import from_onnx

    if json_out is not None and model is None and input_path is None:
        model, json_out = json_out, "-"  # the old flag before the model: `inspect --json MODEL [--check]`
    path = model_arg(model, input_path)
    if check:
        _check(path, parse_shapes(input_shape), parse_freeze(freeze), json_out, parse_dynamic(dynamic))
        return
    ir = from_onnx(path, parse_shapes(input_shape), freeze=parse_freeze(freeze), dynamic=parse_dynamic(dynamic))
    info = {
        "model": path,
        "inputs": [t.to_dict() for t in ir.input_nodes],
        "outputs": [t.to_dict() for t in ir.output_nodes],
        "dynamic": ir.describe_dynamic(),
        "operators": ir.operators,
        "graph_count": ir.graph_count,
        "subgraph_count": ir.subgraph_count,
        "hash": f"{ir.structural_hash():016x}",
        "fingerprint": ir.fingerprint,
    }
    write_json(json_out, info)
    if json_out == "-":
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=os.path.basename(path), show_header=True)
    for column in ("", "name", "shape", "dtype"):
        table.add_column(column)
    for kind, items in (("input", info["inputs"]), ("output", info["outputs"])):
        for t in items:
            table.add_row(kind, t["name"], fmt_shape(t["shape"]), t["dtype"])
    console.print(table)
    if info["dynamic"]:
        ranges = ", ".join(f"{k}={r['min']}..{r['max'] if r['max'] is not None else ''}"
                           for k, r in info["dynamic"].items())
        console.print(f"dynamic: {ranges}", highlight=False)
    ops = ", ".join(f"{k}×{v}" for k, v in info["operators"].items())
    console.print(f"operators: {ops}", highlight=False)
    console.print(f"hash: {info['hash']}   fingerprint: {info['fingerprint']}", highlight=False)


def _check(path: str, shapes: dict | None, freeze: dict | None, json_out: str | None,
           dynamic: dict | None = None) -> None:
    """``inspect --check``: unsupported operators first (milliseconds, exit 4), then the real import, so
    "imports" is only ever said of a model that does."""
    from ..errors import ForgekitError, UnsupportedOperatorError
    from ..importer import check_report

    report: dict[str, Any] = {"model": path, **check_report(path, shapes)}
    failure: ForgekitError | None = None
    if not report["unsupported"]:
        from ..model import from_onnx

        try:
            ir = from_onnx(path, shapes, freeze=freeze, dynamic=dynamic)  # as compile imports it
            report["dynamic_inputs"] = [{"name": t.name, "shape": list(t.shape)} for t in ir.input_nodes
                                        if not all(isinstance(d, int) for d in t.shape)]
        except ForgekitError as exc:
            failure = exc
    report["imports"] = failure is None and not report["unsupported"]
    report["error"] = str(failure) if failure is not None else None
    write_json(json_out, report)
    if json_out != "-":
        by_op: dict[str, list[str]] = {}
        for item in report["unsupported"]:
            by_op.setdefault(item["op"], []).append(item["node"])
        for op, nodes in by_op.items():
            print(f"unsupported: {op} ({len(nodes)}): {', '.join(nodes)}")
        for item in report["dynamic_inputs"] if failure is None else []:  # a failed import's error names them
            shape = "?" if item["shape"] is None else fmt_shape(item["shape"])
            print(f"dynamic input: {item['name']} [{shape}] (kept dynamic; pin it with --input-shape "
                  f"{item['name']}=... for a fixed size)")
        if report["imports"]:
            print(f"{path}: every operator is supported and the model imports")
    if report["unsupported"]:
        raise typer.Exit(UnsupportedOperatorError.exit_code)
    if failure is not None:
        raise failure
