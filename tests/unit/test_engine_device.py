"""``Engine(path, device=...)`` (issue 36): the device spelling, an artifact asked to run where it has no code,
and the transfer path (host arrays, DLPack tensors, outputs as numpy or as tensors) on the CPU, which is what
this machine has: the same functions move tensors to and from a GPU (checked on one by bench/gpu_run.py)."""

from __future__ import annotations

import numpy as np
import pytest

from forgekit.errors import IncompatibleArtifactError, NotAvailableError, UsageError
from forgekit.runtime import Engine
from forgekit.runtime.device import Device, has_nvidia_gpu, parse_device

CUDA_META = {"build": {"device": {"os": "linux", "kind": "cuda", "gpu_arch": "sm_90"}}}
CPU_META = {"build": {"device": {"os": "linux", "kind": "cpu"}}}


@pytest.mark.parametrize("spec, meta, expected", [
    (None, CPU_META, Device("cpu")), (None, CUDA_META, Device("cuda", 0)), ("cuda", CUDA_META, Device("cuda", 0)),
    ("CUDA:1", CUDA_META, Device("cuda", 1)), (" cpu ", CPU_META, Device("cpu")), ("cpu:0", CPU_META, Device("cpu")),
    (None, {}, Device("cpu")),  # an artifact from before build.device: its family decides, none: the CPU
])
def test_device_spellings(spec, meta, expected) -> None:
    assert parse_device(spec, meta) == expected


@pytest.mark.parametrize("spec", ["gpu", "cuda:x", "cuda:-1", "cpu:1", "rocm", "cuda:"])
def test_a_device_forgekit_does_not_know_is_one_usage_line(spec) -> None:
    with pytest.raises(UsageError, match="cpu, cuda or cuda:N"):
        parse_device(spec, CUDA_META)


def test_an_artifact_asked_to_run_where_it_has_no_code() -> None:
    with pytest.raises(IncompatibleArtifactError, match="holds CUDA code and cannot run on cpu"):
        parse_device("cpu", CUDA_META)
    with pytest.raises(IncompatibleArtifactError, match="holds CPU code and cannot run on cuda:0.*-t cuda/sm_XX"):
        parse_device("cuda", CPU_META)


def test_cpu_engine_takes_arrays_and_dlpack_tensors_and_returns_either(convnet_compiled, convnet_input) -> None:
    import tvm_ffi

    engine = Engine(convnet_compiled, device="cpu")
    assert engine.device == Device("cpu") and engine.device_name is None
    expected = engine.infer(convnet_input)[0]
    tensors = engine.infer(convnet_input, as_numpy=False)
    assert all(hasattr(t, "__dlpack__") for t in tensors)
    np.testing.assert_array_equal(np.from_dlpack(tensors[0]), expected)
    # a DLPack tensor (what torch/cupy hand over) is taken as it is
    np.testing.assert_array_equal(engine.infer(tvm_ffi.from_dlpack(np.ascontiguousarray(convnet_input)))[0], expected)
    # outputs are copies: the next inference does not change them
    first = engine.infer(convnet_input)[0]
    engine.infer(np.zeros_like(convnet_input))
    np.testing.assert_array_equal(first, expected)


def test_cuda_engine_without_a_gpu_is_one_line(convnet_compiled, tmp_path) -> None:
    """A CPU artifact on 'cuda' is refused before anything loads; a CUDA artifact here (no GPU) names the GPU it
    needs (the real CUDA artifact: tests/unit/test_cuda_device.py)."""
    with pytest.raises(IncompatibleArtifactError):
        Engine(convnet_compiled, device="cuda")
    if has_nvidia_gpu():
        pytest.skip("this machine has an NVIDIA GPU")
    import json
    import shutil

    fake = tmp_path / "cuda_artifact"
    shutil.copytree(convnet_compiled, fake)
    meta = json.loads((fake / "metadata.json").read_text())
    meta["build"]["device"] = {"os": "linux", "kind": "cuda", "gpu_arch": "sm_90", "gpu_generation": "Hopper"}
    meta["build"]["family"] = "cuda"
    (fake / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(NotAvailableError, match=r"needs an NVIDIA GPU sm_90 \(Hopper\); none found here"):
        Engine(fake)


NO_CRYPTOGRAPHY = """
import sys
sys.modules["cryptography"] = None  # as on a machine without it (a GPU box's torch venv had none)
import numpy as np
from forgekit.errors import ArtifactError
from forgekit.runtime import Engine
engine = Engine(sys.argv[1])
print(engine.infer(np.load(sys.argv[2]))[0].shape, engine.encrypted)
try:
    Engine(sys.argv[3], password="correct horse battery")
except ArtifactError as exc:
    print("ERR", exc)
"""


def test_plain_artifacts_run_without_cryptography(convnet_compiled, convnet_input, tmp_path) -> None:
    """Engine asks every artifact whether it is encrypted; asking needed `cryptography` (forgekit.crypto imported
    its AES code eagerly), so a machine without it ran no artifact at all.  Decrypting still needs it: one line."""
    import shutil
    import subprocess
    import sys

    from forgekit.artifact.encryption import encrypt_artifact

    shutil.copytree(convnet_compiled, tmp_path / "sealed")
    encrypt_artifact(tmp_path / "sealed", "correct horse battery")
    np.save(tmp_path / "x.npy", convnet_input)
    done = subprocess.run([sys.executable, "-c", NO_CRYPTOGRAPHY, str(convnet_compiled), str(tmp_path / "x.npy"),
                           str(tmp_path / "sealed")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "(2, 4) False" or lines[0].endswith("False"), lines
    assert lines[1].startswith("ERR") and "needs the cryptography package" in lines[1], lines
