"""A branch of a runtime ``If`` that cannot run at the pinned input shapes raises when taken, as in onnxruntime.

Silero VAD picks its 16 kHz or 8 kHz sub-model with ``If(sr == 16000)``; each expects its own chunk length
(512 or 256 samples).  Pinned to 512, the 8 kHz branch's LSTM gets a ``[1, 1, 1, 128, 2]`` input: the model
is only wrong there if that branch is taken, and onnxruntime fails then, at run time.  TVM's frontend
converts both branches and failed the whole import ("Matmul requires the reduction length ...") unless
``sr`` was frozen.  Here a branch whose conversion fails while its sibling converts becomes the sibling's
value behind a kernel that fails at run time with the conversion's reason; a warning says so at import.
Both failing is still the import error.  Unsupported operators never get here (they are refused, all at
once, before conversion).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import onnx
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _fe

from ... import log
from ..errors import ConversionError

_MODEL: contextvars.ContextVar[onnx.ModelProto | None] = contextvars.ContextVar("forgekit_if_model", default=None)
_ORIG_CONVERT_SUBGRAPH = _fe.ONNXGraphImporter._convert_subgraph


def _if_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        if node.op_type == "If":
            yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _if_nodes(attr.g)


def _sibling(graph: onnx.GraphProto) -> tuple[onnx.NodeProto, onnx.GraphProto] | None:
    """The If node that holds ``graph`` as a branch, and its other branch."""
    model = _MODEL.get()
    if model is None:
        return None
    for node in _if_nodes(model.graph):
        branches = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
        then, other = branches.get("then_branch"), branches.get("else_branch")
        for mine, theirs in ((then, other), (other, then)):
            if mine is not None and theirs is not None and mine.name == graph.name and mine == graph:
                return node, theirs
    return None


def _constant_condition(importer, node: onnx.NodeProto) -> bool:
    """Whether the If's condition is known at import (then the failing branch is the one taken, or folded)."""
    cond = importer._nodes.get(node.input[0])
    return cond is None or isinstance(cond, tvm.ir.GenericConst)


def _convert_subgraph(self, bb, graph):
    cache = self.__dict__.setdefault("_forgekit_branches", {})
    key = graph.name, tuple(o.name for o in graph.output), len(graph.node)
    if key in cache:  # the sibling of a failed branch, converted already to stand in for it
        return cache[key]
    try:
        out = _ORIG_CONVERT_SUBGRAPH(self, bb, graph)
    except ConversionError as exc:
        failed = self.__dict__.setdefault("_forgekit_failed", set())
        found = _sibling(graph)
        if found is None or key in failed or _constant_condition(self, found[0]):
            raise
        failed.add(key)  # its sibling must not fall back on it in turn
        node, sibling = found
        try:
            other = _convert_subgraph(self, bb, sibling)
        except ConversionError:
            raise exc from None
        reason = f"If node '{node.name}': its branch '{graph.name}' cannot be converted at these input shapes ({exc.detail})"
        out = _raising(bb, self._nodes.get(node.input[0]), other, reason)
        if out is None:
            raise exc from None
        log.warn(f"{reason}; it raises at run time if taken, as in onnxruntime")
    cache[key] = out
    return out


def _raising(bb, cond, other, reason: str):
    """``other`` (the sibling's value) behind a kernel that fails with ``reason`` when run: a TIR assertion, which
    every runtime (Python, C) reports, where Relax's ``assert_op`` needs TVM's Python package.  The kernel reads
    the condition and adds its zero to the first output, so nothing removes it; it runs inside the branch only."""
    first = other.fields[0] if isinstance(other, relax.Tuple) else other
    dtype = str(getattr(first.ty, "dtype", ""))
    if cond is None or not dtype.startswith(("float", "int", "uint")):
        return None
    text = reason[:300]
    source = "\n".join([
        "@T.prim_func(private=True, s_tir=True)",
        f"def unavailable(cond: T.Buffer((), '{cond.ty.dtype}'), out: T.Buffer((), '{dtype}')):",
        '    T.func_attr({"tirx.is_scheduled": True, "op_pattern": 8, "tirx.noalias": True})',
        '    with T.sblock("unavailable"):',
        "        T.reads(cond[()])",
        "        T.writes(out[()])",
        f"        assert T.bool(False), ('RuntimeError', [{text!r}])",
        f"        out[()] = T.Cast('{dtype}', cond[()]) * T.Cast('{dtype}', 0)",
    ])
    kernel = bb.add_func(tvm.script.from_source(source, extra_vars={"T": tvm.script.tirx}), "branch_unavailable")
    flag = relax.Var("unavailable", relax.TensorType((), dtype))
    check = relax.BindingBlock([relax.VarBinding(flag, relax.call_tir(kernel, [cond], relax.TensorType((), dtype)))])
    value = relax.op.add(first, flag)
    return relax.SeqExpr([check], relax.Tuple([value, *other.fields[1:]]) if isinstance(other, relax.Tuple) else value)


@contextlib.contextmanager
def runtime_failing_branches(model: onnx.ModelProto):
    """Within the block, TVM's frontend converts ``model`` with the branch fallback above."""
    token = _MODEL.set(model)
    previous = _fe.ONNXGraphImporter._convert_subgraph
    _fe.ONNXGraphImporter._convert_subgraph = _convert_subgraph
    try:
        yield
    finally:
        _fe.ONNXGraphImporter._convert_subgraph = previous
        _MODEL.reset(token)
