"""forgekit: ONNX models to fast, deployable libraries for many targets, on Apache TVM (Relax).

The public API is loaded lazily so that ``import forgekit.runtime`` (deployment) never imports the TVM
compiler::

    import forgekit as forge
    ir = forge.from_onnx("resnet50.onnx")
    ir.compile(target="raspberry-pi/5", output_path="out/")
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "IRModule": "forgekit.model",
    "RelayModule": "forgekit.model",
    "ONNXModule": "forgekit.model.onnx_module",
    "from_onnx": "forgekit.model",
    "compile_model": "forgekit.model",
    "CompileResult": "forgekit.artifact.writer",
    "CompileOptions": "forgekit.options",
    "QuantizeOptions": "forgekit.options",
    "Engine": "forgekit.runtime",
    "parse_target": "forgekit.targets",
    "list_target_tags": "forgekit.targets",
    "list_cuda_tags": "forgekit.targets",
    "list_x86_tags": "forgekit.targets",
    "list_arm_tags": "forgekit.targets",
    "list_android_tags": "forgekit.targets",
    "ForgekitError": "forgekit.errors",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'forgekit' has no attribute '{name}'")
    try:
        value = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:
        if not exc.name or not f"{module}.".startswith(f"{exc.name}.") or exc.name == "forgekit":
            raise
        # The forgekit-runtime wheel (runtime/python/) ships forgekit.runtime and what it imports, nothing else.
        raise ImportError(f"forgekit.{name} needs the full forgekit (pip install forgekit): this environment has "
                          "forgekit-runtime, which only runs artifacts (forgekit.runtime.Engine)") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
