"""Prove an artifact by running it: on its own architecture, against onnxruntime on the same inputs.

``verify_artifact`` reads what the artifact was built for from its metadata, makes seeded inputs from the
metadata's input specs, runs the artifact on the device its target family names (this machine in a child
process, or an aarch64 Debian chroot under qemu: :mod:`forgekit.devices`), runs the ONNX model with
onnxruntime on the host, and compares every output (:mod:`.compare`).  A crash on the device (an illegal
instruction, a bad library) is a failed verification, not the caller's crash.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..artifact.layout import read_metadata, resolve
from ..errors import ArtifactError, NotAvailableError, VerificationError
from ..runtime.inputs import example_inputs, user_inputs
from . import bf16_reference, reference
from .compare import ATOL, RTOL, OutputComparison, compare, min_cosine_for


@dataclass
class VerifyResult:
    """Outcome of :func:`verify_artifact`."""

    artifact: str
    target: str
    arch: str
    runner: str  # "native" or "qemu-<arch>"
    rtol: float
    atol: float
    seed: int
    outputs: list[OutputComparison] = field(default_factory=list)
    run_seconds: float = 0.0  # the device run: process start, load and one inference
    infer_ms: float = 0.0
    level: str | None = None  # the instruction-set level the device loaded (portable artifacts)
    min_cosine: float | None = None  # the criterion of a bf16/fp16/quantized artifact (compare.min_cosine_for)
    inputs_given: bool = False  # run on the caller's inputs, not on seeded random ones

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    def check(self) -> None:
        """Raise a one-line :class:`VerificationError` unless every output matched."""
        bad = [o for o in self.outputs if not o.ok]
        if bad:
            worst = ", ".join(f"'{o.name}' max abs err {o.max_abs:.3g} (atol {o.tolerance:.1g})" if not o.note
                              else f"'{o.name}' {o.note}" for o in bad)
            criterion = (f"cosine >= {self.min_cosine:g}" if self.min_cosine is not None
                         else f"rtol {self.rtol:g}, atol {self.atol:g}*max|ref|")
            raise VerificationError(f"{len(bad)} of {len(self.outputs)} output(s) of '{self.artifact}' differ from "
                                    f"onnxruntime ({criterion}): {worst}.")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ok"] = self.ok
        return out


def device_for(meta: dict[str, Any], log: Callable[[str], None] | None = None) -> Any:
    """The device that runs an artifact with this metadata from this machine (its family decides)."""
    from ..targets import get_family

    from ..devices.rootfs import GUESTS
    from ..runtime.cpu import host_arch

    build = meta.get("build", {})
    arch = build.get("arch", "")
    device = get_family(build.get("family") or "other").device(arch, log=log)
    if device is None:
        if build.get("family") == "cuda":  # what forgekit.runtime says of it, with what the GPU must be
            from ..runtime.compat import check_runnable

            check_runnable(meta)
        why = (f"an {build.get('family')} artifact needs its own device" if build.get("family") == "android"
               else f"this machine is {host_arch()} and cannot emulate '{arch}' (only {', '.join(GUESTS)})")
        raise NotAvailableError(f"forgekit cannot run this artifact here: {why}; run it on such a machine "
                                "(forgekit-run or 'forgekit run').")
    return device


def verify_artifact(artifact: str | os.PathLike[str], onnx_model: str | os.PathLike[str], *, rtol: float = RTOL,
                    atol: float = ATOL, seed: int = 0, key_path: str | None = None, password: str | None = None,
                    timeout: float = 1800, log: Callable[[str], None] | None = None,
                    inputs: Mapping[str, Any] | Sequence[Any] | None = None) -> VerifyResult:
    """Run ``artifact`` on its own architecture and compare its outputs with onnxruntime's on ``onnx_model``.

    Returns a :class:`VerifyResult` (call ``.check()`` to raise on a mismatch).  Raises
    :class:`VerificationError` when the artifact cannot run, :class:`~forgekit.errors.InputError` when the
    model's inputs do not correspond to the artifact's, :class:`NotAvailableError` for artifacts forgekit
    cannot execute here (Android, CUDA, other CPUs), :class:`ToolchainError` when qemu or debootstrap is
    missing.  ``log`` receives progress lines (the first aarch64 verification builds the cached rootfs,
    which takes minutes).  ``inputs``: the arrays to run on (by name, or a list in input order) instead of
    seeded random ones, which lie in the values the metadata records for an input (the rows of the table an
    index reads, a quantized model's calibration range), else floats in [0, 1) and integers in [0, 10).
    Inputs compiled away with ``--freeze`` are fed to onnxruntime with their frozen values.
    """
    from ..devices.staging import stage_artifact

    library, meta_path = resolve(artifact)
    if meta_path is None:
        raise ArtifactError(f"'{artifact}' has no metadata.json: verify needs the artifact directory.")
    meta = read_metadata(meta_path)
    build, model = meta["build"], meta["model"]
    device = device_for(meta, log)
    sess = reference.session(onnx_model)
    names, given = [t["name"] for t in model["inputs"]], inputs is not None
    inputs = (user_inputs(model["inputs"], inputs, model.get("dynamic")) if given else
              example_inputs(model["inputs"], random=True, seed=seed, ranges=model.get("dynamic")))
    fed = reference.feeds(sess, names, inputs, f"'{onnx_model}'", model.get("frozen"))
    expected = reference.run(sess, fed, f"'{onnx_model}'")
    result = VerifyResult(str(artifact), build.get("target_name", ""), build.get("arch", ""), device.name, rtol, atol,
                          seed, inputs_given=given)
    with tempfile.TemporaryDirectory(prefix="forgekit-verify-") as scratch:
        staged = stage_artifact(library, meta_path, Path(scratch) / "artifact", key_path, password)
        run = device.run(staged, inputs, timeout=timeout)
    if len(run.outputs) != len(expected):
        raise VerificationError(f"'{artifact}' returned {len(run.outputs)} output(s), onnxruntime {len(expected)}: "
                                "is it the model the artifact was compiled from?")
    result.run_seconds, result.infer_ms = run.seconds, run.infer_ms[0] if run.infer_ms else 0.0
    result.level = run.level
    result.min_cosine = min_cosine_for(model)
    outs = [t["name"] for t in model["outputs"]] or [o.name for o in sess.get_outputs()]
    result.outputs = [compare(n, a, e, rtol, atol, result.min_cosine) for n, a, e in zip(outs, run.outputs, expected)]
    if not result.ok:  # an ill-conditioned output, or a wrong one?
        if result.min_cosine is None:
            noise = reference.fp32_noise(onnx_model, fed, expected)
            result.outputs = [compare(n, a, e, rtol, atol, None, f)
                              for n, a, e, f in zip(outs, run.outputs, expected, noise)]
        else:
            noise = reference.cosine_noise(onnx_model, fed, expected)
            bf16 = (bf16_reference.bf16_noise(onnx_model, fed, expected) if model.get("precision") == "bfloat16"
                    else [0.0] * len(expected))
            result.outputs = [compare(n, a, e, rtol, atol, result.min_cosine, cosine_noise=f, bf16_noise=b)
                              for n, a, e, f, b in zip(outs, run.outputs, expected, noise, bf16)]
    return result
