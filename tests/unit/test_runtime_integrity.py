"""The runtime runs what compile wrote (forgekit/runtime/integrity.py): a library or shared-weights file whose
bytes differ from the sha256 in metadata.json is refused at load (exit 7), in Python and in the C runtime, and
verify says so; an artifact replaced at the same path is loaded anew in the same process."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import forgekit as forge
from forgekit.errors import ArtifactError
from onnx_models import constant_op_model
from forgekit.runtime import Engine


def scale_model(factor: float) -> onnx.ModelProto:
    """y = x * w with w a 64 KiB constant of ``factor``: the weights are in the library."""
    return constant_op_model("Mul", factor, (128, 128))


def flip_byte(path: Path, where: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * where)] ^= 0x01
    path.write_bytes(bytes(data))  # same size: check_size cannot tell


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("integrity") / "out"
    forge.from_onnx(scale_model(2.0)).compile(target="host", output_path=out)
    return out


def test_flipped_byte_refused_at_load(artifact, tmp_path) -> None:
    copy = shutil.copytree(artifact, tmp_path / "copy")
    flip_byte(copy / "model_library.so")
    with pytest.raises(ArtifactError, match="does not match the sha256 in its metadata.json"):
        Engine(copy)
    done = subprocess.run([sys.executable, "-m", "forgekit", "run", str(copy), "--random"],
                          capture_output=True, text=True)
    assert done.returncode == 7 and "does not match the sha256" in done.stderr and "Traceback" not in done.stderr


def test_verify_refuses_a_flipped_byte_naming_the_users_file(artifact, tmp_path) -> None:
    """verify passed a corrupted library (it ran); now exit 7 naming the file as the user has it, not the staged
    copy verify runs."""
    copy = shutil.copytree(artifact, tmp_path / "copy")
    onnx.save(scale_model(2.0), tmp_path / "m.onnx")
    flip_byte(copy / "model_library.so")
    done = subprocess.run([sys.executable, "-m", "forgekit", "verify", str(copy), "--onnx", str(tmp_path / "m.onnx")],
                          capture_output=True, text=True)
    assert done.returncode == 7 and f"'{copy / 'model_library.so'}' does not match the sha256" in done.stderr, \
        done.stderr


def test_portable_levels_and_shared_weights_checked(tmp_path) -> None:
    out = tmp_path / "portable"
    forge.from_onnx(scale_model(2.0)).compile(output_path=out)  # x86-64: levels sharing a weights file
    weights = next(out.glob("model_weights.*.bin"))
    engine = Engine(out)
    assert engine.level is not None
    del engine
    flip_byte(weights, 0.9)
    with pytest.raises(ArtifactError, match=rf"{weights.name}' does not match the sha256"):
        Engine(out)


def test_replaced_artifact_is_reloaded_in_the_same_process(tmp_path) -> None:
    out = tmp_path / "out"
    x = np.ones((128, 128), np.float32)
    forge.from_onnx(scale_model(2.0)).compile(target="host", output_path=out)
    first = Engine(out)
    assert float(first.infer(x)[0][0, 0]) == 2.0
    forge.from_onnx(scale_model(3.0)).compile(target="host", output_path=out, force_overwrite=True)
    assert float(Engine(out).infer(x)[0][0, 0]) == 3.0  # was 2.0: dlopen handed back the old library
    assert float(first.infer(x)[0][0, 0]) == 2.0  # the engine made before keeps the code it loaded
    assert float(Engine(out).infer(x)[0][0, 0]) == 3.0


_IN_PLACE = r"""
import os, sys
import numpy as np
from forgekit.runtime import Engine
out, new = sys.argv[1], sys.argv[2]
x = np.ones((128, 128), np.float32)
first = Engine(out)
print(float(first.infer(x)[0][0, 0]))
for name in ("model_library.so", "metadata.json"):
    with open(os.path.join(out, name), "r+b") as handle:
        handle.truncate(0)
        handle.write(open(os.path.join(new, name), "rb").read())
print(float(Engine(out).infer(x)[0][0, 0]), flush=True)
# The first engine's code was rewritten under it: its teardown would run the new bytes (SIGSEGV at exit, a
# cost of overwriting a loaded library in place that no runtime can avoid; forgekit compile renames instead).
os._exit(0)
"""


def test_overwritten_in_place_is_loaded_anew(tmp_path) -> None:
    """``cp`` onto a loaded library keeps its inode: dlopen would return the old code under any name.  In a
    process of its own (see _IN_PLACE)."""
    out, new = tmp_path / "out", tmp_path / "new"
    forge.from_onnx(scale_model(2.0)).compile(target="host", output_path=out)
    forge.from_onnx(scale_model(5.0)).compile(target="host", output_path=new)
    inode = (out / "model_library.so").stat().st_ino
    done = subprocess.run([sys.executable, "-c", _IN_PLACE, str(out), str(new)], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.split() == ["2.0", "5.0"], (done.stdout, done.stderr)
    assert (out / "model_library.so").stat().st_ino == inode
