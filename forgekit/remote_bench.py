"""``forgekit bench`` on a remote device over TVM RPC (see :mod:`forgekit.rpc`).

The artifact's library (decrypted on this machine first: the board gets plaintext code, never the key)
is uploaded and loaded on the device, the Relax VM is built there over the remote CPU device, seeded
inputs are copied in, and the remote ``time_evaluator`` times ``invoke_stateful`` on the device itself,
so the network round trip is not in the numbers.  The outputs are fetched and, with an ONNX model,
compared with onnxruntime running on this machine.  onnxruntime is not timed: its speed here says
nothing about the board.
"""

from __future__ import annotations

import gc
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ArtifactError, RPCError
from .metadata import LIBRARY_FILE
from .rpc import RpcConfig, check_arch, connect, load_library


def _flatten(value: Any) -> list[Any]:
    """Remote VM outputs (a tensor or nested tuples of them) as a flat list."""
    if hasattr(value, "numpy"):
        return [value]
    out: list[Any] = []
    for item in value:
        out.extend(_flatten(item))
    return out


def benchmark_remote(artifact: str | os.PathLike[str], config: RpcConfig, onnx_model: str | None = None, *,
                     runs: int = 20, warmup: int = 3, key_path: str | None = None, password: str | None = None,
                     rtol: float = 1e-3, atol: float = 1e-4) -> Any:
    """Time ``artifact`` on the RPC device of ``config``; returns a :class:`forgekit.bench.BenchResult`
    whose ``extra["rpc"]`` says where it ran (``onnxruntime`` is None: only its outputs are used)."""
    from .bench import BenchResult, Timing, _stats
    from .runtime import _resolve, example_inputs
    from .verify import _stage_artifact, compare

    library, meta_path = _resolve(Path(artifact))
    if meta_path is None:
        raise ArtifactError(f"'{artifact}' has no metadata.json: a remote bench needs the artifact directory.")
    meta = json.loads(meta_path.read_text())
    build, model = meta.get("build", {}), meta.get("model", {})
    if build.get("family") in ("android", "cuda"):
        raise RPCError(f"'{artifact}' is a {build['family']} artifact: forgekit benches CPU Linux artifacts over RPC.")
    inputs = example_inputs(model.get("inputs", []), random=True, seed=0)
    expected = _reference(onnx_model, model, inputs) if onnx_model else None
    with tempfile.TemporaryDirectory(prefix="forgekit-rpc-") as tmp:
        # the same staging as verify: a decrypted copy of an encrypted library, a plain copy otherwise
        _stage_artifact(library, meta_path, Path(tmp) / "artifact", key_path, password)
        failure, (remote, outputs, seconds) = _run_remote(Path(tmp) / "artifact" / LIBRARY_FILE, build.get("arch", ""),
                                                          str(artifact), config, inputs, runs, warmup)
    # The board serves one session at a time: the session must be gone before anything else asks for it.
    # Every remote handle lived in _run_remote's frame (not in a traceback kept by the raise below); the
    # collection frees any cycle that still holds one.
    gc.collect()
    if failure is not None:
        raise failure
    result = BenchResult(artifact=str(artifact), threads=0, forgekit=Timing(**_stats([s * 1e3 for s in seconds])),
                         compile_seconds=build.get("compile_seconds"), target=build.get("target_name"))
    result.extra["rpc"] = {"device": config.describe(), "remote_arch": remote}
    if expected is not None:
        if len(outputs) != len(expected):
            raise RPCError(f"'{artifact}' returned {len(outputs)} output(s) on the device, onnxruntime "
                           f"{len(expected)}: is it the model the artifact was compiled from?")
        checks = [compare(str(i), out, ref, rtol, atol) for i, (out, ref) in enumerate(zip(outputs, expected))]
        worst = max(checks, key=lambda c: c.max_abs / max(c.tolerance / atol if atol else 1.0, 1e-30))
        result.max_abs_error = worst.max_abs
        result.output_scale = worst.tolerance / atol if atol else None
        result.outputs_match = all(c.ok for c in checks)
    return result


def _run_remote(library: Path, arch: str, artifact: str, config: RpcConfig, inputs: list[np.ndarray], runs: int,
                warmup: int) -> tuple[Exception | None, tuple[Any, Any, Any]]:
    """Connect, load, run and time on the device: (error or None, (remote arch, outputs, run seconds)).
    Errors are returned, not raised, so no traceback keeps the session alive after this returns."""
    import tvm
    from tvm.runtime.vm import VirtualMachine

    from .rpc import _first_line

    session = module = vm = args = timer = dev = None
    try:
        session = connect(config)
        remote = check_arch(session, arch, f"'{artifact}'", config)
        module = load_library(session, library, config)
        dev = session.cpu(0)
        vm = VirtualMachine(module, dev)
        args = [tvm.runtime.tensor(a, dev) for a in inputs]
        vm.set_input("main", *args)
        for _ in range(max(warmup, 1)):  # at least once: the outputs are read from this run
            vm.invoke_stateful("main")
        outputs = [o.numpy() for o in _flatten(vm.get_outputs("main"))]
        # number=1: one sample per run, like the local bench (time_evaluator adds one untimed call)
        timer = vm.time_evaluator("invoke_stateful", dev, number=1, repeat=runs)
        seconds = [float(s) for s in timer("main").results]
        return None, (remote, outputs, seconds)
    except RPCError as exc:
        return RPCError(str(exc)), (None, None, None)
    except Exception as exc:
        return (RPCError(f"Running '{artifact}' on the RPC device ({config.describe()}) failed: {_first_line(exc)}"),
                (None, None, None))
    finally:
        session = module = vm = args = timer = dev = None


def _reference(onnx_model: str, model: dict[str, Any], inputs: list[np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's outputs on this machine for the artifact's inputs."""
    from .verify import _feeds, _ort_session

    session = _ort_session(onnx_model)
    feeds = _feeds(session, [t["name"] for t in model.get("inputs", [])], inputs)
    return [np.asarray(r) for r in session.run(None, feeds)]
