"""Prove an artifact by running it: on its own architecture, against onnxruntime on the same inputs.

``verify_artifact`` reads what the artifact was built for from its metadata, makes seeded inputs from
the metadata's input specs, runs the artifact through :class:`forgekit.runtime.Engine` in a child process
(the host's python for host-architecture artifacts; for aarch64 ones, the cached arm64 Debian rootfs of
:mod:`forgekit.targets.qemu` under qemu user-mode emulation), runs the ONNX model with onnxruntime on the
host, and compares every output like the test suite does: ``|actual - ref| <= atol * max|ref| + rtol * |ref|``.

The artifact runs in a child process so that a crash (an illegal instruction, a bad library) is reported
as a failed verification instead of taking the caller down.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .errors import ArtifactError, ForgekitError, ModelLoadError, NotAvailableError, VerificationError
from .metadata import LIBRARY_FILE, METADATA_FILE, read_metadata
from .runtime import _resolve, example_inputs

#: Defaults of ``tests/conftest.py::assert_close``: atol is relative to the reference's largest magnitude.
RTOL = 1e-3
ATOL = 1e-4
#: The forgekit files the guest needs to run an artifact exactly as ``Engine`` does (nothing imports TVM).
_GUEST_FILES = ("__init__.py", "errors.py", "runtime.py", "_verify_runner.py", "crypto/*.py")


@dataclass
class OutputComparison:
    """How one output compares with onnxruntime's.

    ``max_rel`` is ``|actual - ref| / max(|ref|, tolerance)`` at its worst element: relative where the
    reference is not near zero, without dividing by the zeros a softmax or relu produces.
    """

    name: str
    shape: list[int]
    max_abs: float
    max_rel: float
    tolerance: float  # allowed absolute error where the reference is 0 (atol * max|ref|)
    mismatched: int  # elements outside the tolerance
    size: int
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.mismatched == 0 and not self.note

    def line(self) -> str:
        """One human line: name, shape, errors, verdict."""
        shape = "x".join(map(str, self.shape)) or "scalar"
        verdict = "ok" if self.ok else f"MISMATCH ({self.note or f'{self.mismatched}/{self.size} elements'})"
        return (f"{self.name}: {shape} max abs err {self.max_abs:.3e}, max rel err {self.max_rel:.3e} "
                f"(atol {self.tolerance:.1e}) {verdict}")


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
    run_seconds: float = 0.0  # the child process: interpreter start, load and one inference
    infer_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    def check(self) -> None:
        """Raise a one-line :class:`VerificationError` unless every output matched."""
        bad = [o for o in self.outputs if not o.ok]
        if bad:
            worst = ", ".join(f"'{o.name}' max abs err {o.max_abs:.3g} (atol {o.tolerance:.1g})" if not o.note
                              else f"'{o.name}' {o.note}" for o in bad)
            raise VerificationError(f"{len(bad)} of {len(self.outputs)} output(s) of '{self.artifact}' differ from "
                                    f"onnxruntime (rtol {self.rtol:g}, atol {self.atol:g}*max|ref|): {worst}.")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ok"] = self.ok
        return out


def compare(name: str, actual: np.ndarray, expected: np.ndarray, rtol: float = RTOL,
            atol: float = ATOL) -> OutputComparison:
    """Compare one output with its reference: floats within tolerance, everything else exactly."""
    expected, actual = np.asarray(expected), np.asarray(actual)
    if actual.size != expected.size:
        return OutputComparison(name, list(expected.shape), float("inf"), float("inf"), 0.0, expected.size,
                                expected.size, note=f"shape {list(actual.shape)}, expected {list(expected.shape)}")
    ref = expected.astype(np.float64)
    got = actual.reshape(expected.shape).astype(np.float64)
    floating = expected.dtype.kind in "fc"
    finite = np.abs(ref[np.isfinite(ref)])
    scale = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    tol = atol * scale if floating else 0.0
    close = np.isclose(got, ref, rtol=rtol if floating else 0.0, atol=tol, equal_nan=True)
    with np.errstate(invalid="ignore"):
        diff = np.where(close & np.isnan(ref), 0.0, np.abs(got - ref))
    diff = np.nan_to_num(diff, nan=np.inf)
    rel = diff / np.maximum(np.abs(ref), tol if tol > 0 else 1.0)
    return OutputComparison(name, list(expected.shape), float(diff.max(initial=0.0)), float(rel.max(initial=0.0)),
                            tol, int((~close).sum()), int(expected.size))


def verify_artifact(artifact: str | os.PathLike[str], onnx_model: str | os.PathLike[str], *, rtol: float = RTOL,
                    atol: float = ATOL, seed: int = 0, key_path: str | None = None, password: str | None = None,
                    timeout: float = 1800, log: Callable[[str], None] | None = None) -> VerifyResult:
    """Run ``artifact`` on its own architecture and compare its outputs with onnxruntime's on ``onnx_model``.

    Returns a :class:`VerifyResult` (call ``.check()`` to raise on a mismatch).  Raises
    :class:`VerificationError` when the artifact cannot run or the two models' inputs do not correspond,
    :class:`NotAvailableError` for artifacts forgekit cannot execute here (Android, CUDA, other CPUs),
    :class:`ToolchainError` when qemu or debootstrap is missing.  ``log`` receives progress lines (the
    first aarch64 verification builds the cached rootfs, which takes minutes).
    """
    library, meta_path = _resolve(Path(artifact))
    if meta_path is None:
        raise ArtifactError(f"'{artifact}' has no metadata.json: verify needs the artifact directory.")
    meta = read_metadata(meta_path.parent)
    build, model = meta["build"], meta["model"]
    arch, family = build.get("arch", ""), build.get("family", "")
    if family in ("android", "cuda"):
        raise NotAvailableError(f"'{artifact}' is a {family} artifact: forgekit verify runs CPU Linux artifacts only "
                                "(run it on the device with 'forgekit run').")
    native = arch == os.uname().machine
    if not native:
        from .targets import qemu

        qemu.guest(arch)  # unsupported architecture: fail before any work
    session = _ort_session(onnx_model)
    inputs = example_inputs(model["inputs"], random=True, seed=seed)
    feeds = _feeds(session, [t["name"] for t in model["inputs"]], inputs)
    try:
        expected = session.run(None, feeds)
    except Exception as exc:  # onnxruntime raises its own exception types for bad feeds
        raise VerificationError(f"onnxruntime cannot run '{onnx_model}' on the artifact's inputs: "
                                f"{_first_line(str(exc))} Is it the model the artifact was compiled from?") from None
    result = VerifyResult(str(artifact), build.get("target_name", ""), arch, "native" if native else f"qemu-{arch}",
                          rtol, atol, seed)
    with tempfile.TemporaryDirectory(prefix="forgekit-verify-") as scratch:
        work = Path(scratch)
        _stage_artifact(library, meta_path, work / "artifact", key_path, password)
        np.savez(work / "inputs.npz", **{f"arg{i}": a for i, a in enumerate(inputs)})
        start = time.perf_counter()
        if native:
            proc = _run_native(work, timeout)
        else:
            proc = _run_qemu(work, arch, timeout, log)
        result.run_seconds = time.perf_counter() - start
        actual = _collect(proc, work, result.runner)
    if len(actual) != len(expected):
        raise VerificationError(f"'{artifact}' returned {len(actual)} output(s), onnxruntime {len(expected)}: "
                                "is it the model the artifact was compiled from?")
    timings = json.loads(proc.stdout.strip().splitlines()[-1])
    result.infer_ms = timings["infer_ms"]
    names = [t["name"] for t in model["outputs"]] or [o.name for o in session.get_outputs()]
    result.outputs = [compare(n, a, e, rtol, atol) for n, a, e in zip(names, actual, expected)]
    return result


# --------------------------------------------------------------------------- reference
def _ort_session(onnx_model: str | os.PathLike[str]) -> Any:
    try:
        import onnxruntime as ort
    except ImportError:
        raise NotAvailableError("onnxruntime is not installed: pip install onnxruntime (verify's reference).") from None
    if not Path(onnx_model).is_file():
        raise ModelLoadError(f"ONNX model '{onnx_model}' does not exist.")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # deterministic reference
    try:
        return ort.InferenceSession(str(onnx_model), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ModelLoadError(f"onnxruntime cannot load '{onnx_model}': {_first_line(str(exc))}") from None


def _feeds(session: Any, names: list[str], arrays: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Match the artifact's inputs to the ONNX model's by name, else by position when the counts agree."""
    ort_names = [i.name for i in session.get_inputs()]
    if set(names) == set(ort_names):
        return dict(zip(names, arrays))
    if len(ort_names) != len(arrays):
        raise VerificationError(f"The ONNX model has inputs {ort_names} but the artifact has {names}: verify it "
                                "against the model it was compiled from.")
    return dict(zip(ort_names, arrays))


# --------------------------------------------------------------------------- running the artifact
def _stage_artifact(library: Path, meta_path: Path, dest: Path, key_path: str | None, password: str | None) -> None:
    """Copy the artifact into the scratch directory, decrypting an encrypted library on the host: the
    guest then needs neither the key nor the password."""
    from . import crypto

    dest.mkdir()
    shutil.copy2(meta_path, dest / METADATA_FILE)
    if not crypto.is_encrypted(library):
        shutil.copy2(library, dest / LIBRARY_FILE)
        return
    key_path, password = crypto.artifact_key(library, key_path, password)
    crypto.decrypt_library(library, key_path, password, dest / LIBRARY_FILE)


def _run_native(work: Path, timeout: float) -> subprocess.CompletedProcess:
    package_parent = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")]))}
    return _child([sys.executable, "-m", "forgekit._verify_runner", str(work / "artifact"), str(work / "inputs.npz"),
                   str(work / "outputs.npz")], timeout, env=env)


def _run_qemu(work: Path, arch: str, timeout: float, log: Callable[[str], None] | None) -> subprocess.CompletedProcess:
    """Run the runner in the cached rootfs: a scratch directory under the rootfs' /tmp holds forgekit's
    runtime files, the artifact and the inputs, and is removed afterwards."""
    from .targets import qemu

    g = qemu.guest(arch)
    root = qemu.ensure_rootfs(arch, log=log)
    guest_dir = Path(tempfile.mkdtemp(prefix="forgekit-verify-", dir=root / "tmp"))
    try:
        _copy_guest_package(guest_dir / "pkg" / "forgekit")
        for name in ("artifact", "inputs.npz"):
            src = work / name
            (shutil.copytree if src.is_dir() else shutil.copy2)(src, guest_dir / name)
        inside = "/" + str(guest_dir.relative_to(root))
        proc = qemu.run_in_rootfs(root, g, ["/usr/bin/python3", "-m", "forgekit._verify_runner", f"{inside}/artifact",
                                            f"{inside}/inputs.npz", f"{inside}/outputs.npz"], timeout=timeout,
                                  env={"PYTHONPATH": f"{inside}/pkg"})
        if (guest_dir / "outputs.npz").exists():
            shutil.copy2(guest_dir / "outputs.npz", work / "outputs.npz")
        return proc
    finally:
        shutil.rmtree(guest_dir, ignore_errors=True)


def _copy_guest_package(dest: Path) -> None:
    package = Path(__file__).resolve().parent
    for pattern in _GUEST_FILES:
        for src in package.glob(pattern):
            target = dest / src.relative_to(package)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def _child(argv: list[str], timeout: float, env: dict[str, str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise VerificationError(f"The artifact did not finish within {timeout:.0f} s.") from None


def _collect(proc: subprocess.CompletedProcess, work: Path, runner: str) -> list[np.ndarray]:
    """The runner's outputs, or the error it reported (its forgekit exit code) or a crash."""
    if proc.returncode != 0:
        message = _last_line(proc.stderr)
        if 0 < proc.returncode < 64 and "Traceback (most recent call last)" not in proc.stderr:
            # a ForgekitError the runner reported with its exit code (an uncaught exception also exits 1)
            raise ForgekitError.from_code(proc.returncode, message)
        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
        raise VerificationError(f"The artifact crashed ({runner}, {how}): {message}")
    with np.load(work / "outputs.npz") as data:
        return [data[f"out{i}"] for i in range(len(data.files))]


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"
