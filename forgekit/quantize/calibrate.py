"""Calibration: run the model on samples and record statistics of every quantizable op's input.

The module is rewritten so ``main`` also returns those tensors (:func:`graph.expose`) and then built
with the normal scheduled pipeline, so calibrating costs about one fast inference per sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from ..errors import InputError, UsageError
from ..importer.dynamic import ranges_of
from ..runtime.inputs import check_inputs
from . import graph
from .samples import iterate
from .stats import TensorStats

#: calibration samples kept for the accuracy report (forgekit.quantize.report)
KEPT_SAMPLES = 8

if TYPE_CHECKING:
    import tvm


@dataclass
class Calibration:
    """Statistics per quantizable op (op index -> stats of its data input) and what was calibrated."""

    ops: list[graph.QuantOp]
    stats: list[TensorStats]
    samples: int = 0
    device: str = "cpu"
    extra: dict[str, Any] = field(default_factory=dict)


def cuda_target(compute_version: str) -> Any:
    """The target of a CUDA GPU of compute capability ``compute_version`` (``"8.6"`` -> ``cuda -arch=sm_86``):
    forgekit's CUDA builds need the architecture (nvcc compiles for it), so a bare ``cuda`` would fail
    and calibration would quietly run on the CPU."""
    from ..targets import parse_target

    major, minor = str(compute_version).split(".")[:2]
    return parse_target(f"cuda -arch=sm_{int(major)}{int(minor)}")


def flatten_outputs(result: Any) -> list[np.ndarray]:
    """A VM result (a tensor, or tuples of them, nested) as its tensors in order, as numpy arrays."""
    if hasattr(result, "numpy"):
        return [result.numpy()]
    return [o for item in result for o in flatten_outputs(item)]


def build_runner(mod: Any, use_cuda: bool = False) -> tuple[Callable[[list[np.ndarray]], Any], str]:
    """Compile ``mod`` for this machine and return ``run(inputs) -> raw VM result`` and the device name.

    ``use_cuda`` uses the first CUDA GPU when there is one and silently falls back to the CPU otherwise
    (also when the GPU build fails; the GPU path is untested on the CPU-only development machine).
    """
    import tvm
    from tvm import relax

    from ..build import build_executable
    from ..targets import parse_target

    vm = None
    if use_cuda:
        try:
            if tvm.cuda(0).exist:
                spec = cuda_target(tvm.cuda(0).compute_version)
                vm = relax.VirtualMachine(build_executable(mod, spec, opt_level=2), tvm.cuda(0))
                device = tvm.cuda(0)
        except Exception:  # noqa: BLE001 - no CUDA runtime, or the GPU build failed: the CPU does it
            vm = None
    if vm is None:
        device, spec = tvm.cpu(), parse_target("host")
        vm = relax.VirtualMachine(build_executable(mod, spec, opt_level=3), device)

    def run(inputs: list[np.ndarray]) -> Any:
        return vm["main"](*[tvm.runtime.tensor(a, device) for a in inputs])

    return run, "cuda" if spec.is_cuda else "cpu"


def instrument(mod: tvm.IRModule) -> tuple[Any, list[int]]:
    """``mod`` with the data input of every quantizable op exposed as an extra output, and for
    each op (in :func:`graph.describe` order) the position of its tensor among those outputs (ops that
    share an input share the position)."""
    slots: list[int] = []

    def pick(flat: Any) -> Sequence[Any]:
        unique: list[Any] = []
        for _binding, call in graph.quantizable(flat):
            var = call.args[0]
            pos = next((i for i, u in enumerate(unique) if u.same_as(var)), None)
            if pos is None:
                unique.append(var)
                pos = len(unique) - 1
            slots.append(pos)
        return unique

    exposed, _n = graph.expose(mod, pick)
    return exposed, slots


def calibrate(mod: tvm.IRModule, inputs: Sequence[Any], data: Any, *, previous: Calibration | None = None,
              use_cuda: bool = True) -> Calibration:
    """Feed every sample of ``data`` through ``mod`` and return the updated :class:`Calibration`.

    ``inputs`` are the model's input specs (``TensorInfo``: name, shape, dtype) the samples are checked
    against; a stacked array splits along symbolic leading dimensions too (see :mod:`.samples`)."""
    ops = graph.describe(mod["main"])
    if not ops:
        raise UsageError("The model has no conv2d, conv1d or matmul with constant weights: nothing to calibrate.")
    instrumented, slots = instrument(mod)
    calib = previous if previous is not None and len(previous.ops) == len(ops) else Calibration(ops, [])
    unique_stats = {}
    if not calib.stats:
        unique_stats = {p: TensorStats() for p in set(slots)}
        calib.stats = [unique_stats[p] for p in slots]
    else:
        for p, s in zip(slots, calib.stats):
            unique_stats.setdefault(p, s)
    run = None
    count = 0
    names, shapes, dtypes = [t.name for t in inputs], [t.shape for t in inputs], [t.dtype for t in inputs]
    # the runtime's own check of sizes against the --dynamic ranges and steps: a sample the compiled module
    # cannot take (W=641 with W=32..2048:32) failed inside TVM's VM, a traceback ("match_cast error")
    specs = [{"name": n, "shape": s, "dtype": d} for n, s, d in zip(names, shapes, dtypes)]
    ranges = {name: r.to_dict() for name, r in ranges_of(mod).items()}
    for sample in iterate(data, names, shapes, dtypes):
        try:
            check_inputs(specs, sample, ranges)
        except InputError as exc:
            raise InputError(f"Calibration sample {count + 1}: {exc}") from None
        if run is None:
            run, calib.device = build_runner(instrumented, use_cuda)
        result = run(sample)
        kept = calib.extra.setdefault("samples", [])
        if len(kept) < KEPT_SAMPLES:  # for the accuracy report and max_accuracy_drop
            kept.append(sample)
        _record_inputs(calib.extra.setdefault("inputs", {}), names, sample)
        for p, tensor in enumerate(result[1]):
            if p in unique_stats:
                unique_stats[p].update(tensor.numpy())
        count += 1
    if count == 0:
        raise UsageError("Calibration data is empty: pass at least one sample.")
    calib.samples += count
    return calib


def _record_inputs(record: dict[str, list[float]], names: Sequence[str], sample: Sequence[np.ndarray]) -> None:
    """Running min, max, sum, sum of squares and count of each float input over the calibration samples."""
    for name, array in zip(names, sample):
        if array.dtype.kind != "f" or not array.size:
            continue
        values = array.astype(np.float64)
        low, high, total, squares, count = record.get(name, [np.inf, -np.inf, 0.0, 0.0, 0])
        record[name] = [min(low, float(values.min())), max(high, float(values.max())), total + float(values.sum()),
                        squares + float(np.square(values).sum()), count + int(values.size)]


def input_values(calib: Calibration | None) -> dict[str, dict[str, float]]:
    """Float input -> ``{"min", "max", "mean", "std"}`` of its calibration samples: the inputs an int8
    artifact was calibrated for, and so the ones ``verify``/``bench`` judge it on (on U[0, 1) pixels a correct
    int8 classifier calibrated on images in [0, 255] is all rounding error)."""
    out = {}
    for name, (low, high, total, squares, count) in ((calib.extra.get("inputs") or {}).items() if calib else ()):
        mean = total / count
        std = max(squares / count - mean * mean, 0.0) ** 0.5
        out[name] = {"min": low, "max": high, "mean": mean, "std": std}
    return out
