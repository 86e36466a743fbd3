"""TensorRT-style partitioning of a Relax module: TVM's partitioner, a size filter, ONNX subgraphs, checks.

``tvm.relax.backend.contrib.tensorrt`` ships the 52 single-operator patterns of TVM's TensorRT BYOC and
``partition_for_tensorrt`` (``FuseOpsByPattern`` + ``MergeCompositeFunctions``); we call the same two passes
with the same patterns, minus those whose operator :mod:`.relax_onnx` cannot write (3-D convolutions and
pools, transposed convolutions, ``layout_transform``, ``resize2d``: none appears in the models users bring
us from ONNX at opset >= 11 in NCHW, and an offloaded region that cannot leave as ONNX is of no use here).
TVM's partitioner has no size or cost filter: a lone ``relu`` becomes a partition, and each partition costs
a host<->device copy of its inputs and outputs.  So partitions with fewer than ``min_ops`` operators or
fewer than ``min_macs`` multiply-accumulates are put back into ``main`` (onnxruntime's TensorRT provider
has the same knob, ``trt_min_subgraph_size``).

The wheel has no TensorRT codegen or runtime (``RunCodegen`` fails: ``relax.ext.tensorrt`` not found), and
TensorRT's libraries cannot be installed here, so no engine is built: each partition is exported as a
standalone ONNX model (what ``trtexec --onnx`` or onnxruntime's TensorRT provider take) and checked in
onnxruntime against TVM's result for the same function (:func:`check_subgraphs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .partition import Partition, codegen_functions, describe, inline_partitions
from .relax_onnx import EXPORTABLE, export_partition

#: TVM's composite names whose Relax operator is not spelled like the composite
_COMPOSITE_OP = {"nn.batch_matmul": "matmul", "transpose": "permute_dims", "concatenate": "concat"}
DEFAULT_MIN_OPS = 2
DEFAULT_MIN_MACS = 1


def patterns() -> list[Any]:
    """TVM's TensorRT patterns whose operator forgekit can export as ONNX."""
    from tvm.relax.backend.contrib import tensorrt  # noqa: F401 - registers the patterns
    from tvm.relax.backend.pattern_registry import get_patterns_with_prefix

    out = []
    for pattern in get_patterns_with_prefix("tensorrt"):
        composite = str(pattern.name).removeprefix("tensorrt.")
        if _COMPOSITE_OP.get(composite, composite) in EXPORTABLE:
            out.append(pattern)
    return out


def partition_for_tensorrt(mod: Any, min_ops: int = DEFAULT_MIN_OPS, min_macs: int = DEFAULT_MIN_MACS) -> Any:
    """``mod`` with TensorRT-supported regions as ``Codegen: "tensorrt"`` functions; regions with fewer than
    ``min_ops`` operators or ``min_macs`` multiply-accumulates stay in ``main``."""
    from tvm.relax.transform import FuseOpsByPattern, MergeCompositeFunctions

    mod = inline_partitions(mod)  # partitioning twice partitions the same operators once
    mod = FuseOpsByPattern(patterns(), bind_constants=True, annotate_codegen=False)(mod)
    mod = MergeCompositeFunctions()(mod)
    small = [p.name for p in describe(mod) if len(p.ops) < min_ops or p.macs < min_macs]
    return inline_partitions(mod, small) if small else mod


def is_tensorrt(mod: Any) -> bool:
    return any(str(f.attrs["Codegen"]) == "tensorrt" for f in codegen_functions(mod).values())


def export_subgraphs(mod: Any, folder: str | Path) -> list[Path]:
    """Write each partition as ``<folder>/<i>_<codegen>.onnx`` plus ``partitions.json``; returns the ONNX paths."""
    import json

    import onnx

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths, rows = [], []
    for i, (info, func) in enumerate(zip(describe(mod), codegen_functions(mod).values())):
        path = folder / f"{i}_{info.codegen}.onnx"
        onnx.save(export_partition(func, f"{info.codegen}_{i}"), path)
        paths.append(path)
        rows.append({**info.to_dict(), "onnx": path.name})
    (folder / "partitions.json").write_text(json.dumps(rows, indent=2) + "\n")
    return paths


@dataclass(frozen=True)
class SubgraphCheck:
    name: str
    max_abs: float
    scale: float
    ok: bool


def standalone(func: Any) -> Any:
    """A module whose ``main`` computes ``func`` with plain operators (what TVM compiles for the host)."""
    from tvm import relax

    from .partition import apply_flat

    bb = relax.BlockBuilder()
    params = [relax.Var(str(p.name), p.ty) for p in func.params]
    with bb.function("main", params):
        with bb.dataflow():
            result = bb.emit_output(apply_flat(func, params, lambda expr, name: bb.emit(expr, name)))
        bb.emit_func_output(result)
    return bb.get()


def check_subgraphs(mod: Any, seed: int = 0, rtol: float = 1e-4, atol: float = 1e-5) -> list[SubgraphCheck]:
    """Each partition's exported ONNX run in onnxruntime against TVM's (LLVM, this CPU) result on seeded inputs.

    ``atol`` is relative to the largest reference value, as :mod:`forgekit.evaluate.compare` does."""
    import onnxruntime as ort
    import tvm
    from tvm import relax

    rng = np.random.default_rng(seed)
    out = []
    for info, func in zip(describe(mod), codegen_functions(mod).values()):
        onnx_model = export_partition(func, info.name)
        feeds = [rng.standard_normal(shape).astype(dtype) for shape, dtype in info.inputs]
        exe = tvm.compile(standalone(func), target=tvm.target.Target({"kind": "llvm"}))
        vm = relax.VirtualMachine(exe, tvm.cpu())
        got = vm["main"](*[tvm.runtime.tensor(a) for a in feeds])
        got_list = [got.numpy()] if hasattr(got, "numpy") else [g.numpy() for g in got]
        session = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        want = session.run(None, dict(zip(names, feeds)))
        scale = max(float(np.max(np.abs(w))) for w in want) or 1.0
        err = max(float(np.max(np.abs(g - w))) for g, w in zip(got_list, want))
        ok = all(np.allclose(g, w, rtol=rtol, atol=atol * scale) for g, w in zip(got_list, want))
        out.append(SubgraphCheck(info.name, err, scale, ok))
    return out


__all__ = ["Partition", "SubgraphCheck", "check_subgraphs", "export_subgraphs", "is_tensorrt",
           "partition_for_tensorrt", "patterns", "standalone"]
