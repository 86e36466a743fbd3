"""Sample models that ship with a dependency, addressable as ``sample:NAME`` on the command line.

The onnx wheel carries nine classic ImageNet graphs under ``onnx/backend/test/data/light/`` with
reference outputs.  Their weights are synthesized (``ConstantOfShape(0.02)``): good for plumbing and
speed, useless for accuracy.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from .errors import ModelLoadError

PREFIX = "sample:"
NAMES = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
         "squeezenet", "vgg19", "zfnet512")


def light_dir() -> Path:
    """Folder of the onnx wheel's light models."""
    import onnx

    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def sample_path(name: str) -> Path:
    """Path of the sample model ``name`` (e.g. ``resnet50``)."""
    if name not in NAMES:
        close = difflib.get_close_matches(name, NAMES, n=3)
        hint = f" Did you mean: {', '.join(close)}?" if close else f" Choose from: {', '.join(NAMES)}."
        raise ModelLoadError(f"Unknown sample model '{name}'.{hint}")
    return light_dir() / f"light_{name}.onnx"


def resolve(model: str) -> str:
    """``sample:NAME`` → its path; anything else unchanged."""
    return str(sample_path(model[len(PREFIX):])) if model.startswith(PREFIX) else model
