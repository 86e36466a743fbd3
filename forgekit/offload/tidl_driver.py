"""``forgekit compile -t ti/<board> --offload tidl``: the plan, and TI's import when TI's tools are here.

TI's tools are licensed downloads (edgeai-tidl-tools ``tidl_tools.tar.gz`` + TI's Python 3.10 onnxruntime):
forgekit never ships them.  Where they are (``TIDL_TOOLS_PATH``, as the ``ti`` image sets it, and a Python
whose onnxruntime has ``TIDLCompilationProvider``: ``FORGEKIT_TIDL_PYTHON``, default ``python3``), forgekit
runs TI's import as a subprocess (:mod:`.tidl_import_script`) with the plan's deny list, so TI's partition
is forgekit's, and with forgekit's calibration samples, or with ``prequantized_model`` when the model is a
Q/DQ export (:class:`forgekit.ONNXModule`); TI's artifacts (``*_tidl_net.bin``, ``*_tidl_io_*.bin``,
``allowedNode.txt``, ``onnxrtMetaData.txt``) are copied into the artifact's ``tidl/`` folder beside the Arm
library.  Without them, one line says what is missing and only the plan is written.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import CompileError, UsageError
from .tidl import TidlPlan, plan_tidl

ACCELERATORS = ("tidl",)
IMPORT_LIBRARY = "tidl_model_import_onnx.so"
ARTIFACT_PATTERNS = ("*_tidl_net.bin", "*_tidl_io_*.bin", "allowedNode.txt", "onnxrtMetaData.txt")


def check_offload(accelerator: str, target: str) -> None:
    """Refuse before compiling: an unknown accelerator, or a target that has no TIDL."""
    from ..targets.ti import board

    if accelerator not in ACCELERATORS:
        raise UsageError(f"Unknown --offload '{accelerator}': forgekit offloads to {', '.join(ACCELERATORS)} "
                         "(TensorRT regions: IRModule.partition_for_tensorrt in Python).")
    ti = board(target)
    if ti is None or not ti.has_tidl:
        raise UsageError(f"--offload tidl needs a TI board with a C7x/MMA accelerator (ti/tda4vm, ti/am68a, "
                         f"ti/am69a, ti/am62a, ti/am67a); '{target}' has none.")


def tools_missing(env: dict[str, str] | None = None) -> str | None:
    """None when TI's import can run here, else what is missing, in one sentence."""
    env = dict(os.environ if env is None else env)
    path = env.get("TIDL_TOOLS_PATH")
    if not path:
        return ("TIDL_TOOLS_PATH is not set (TI's tidl_tools are a licensed download from TI's edgeai-tidl-tools; "
                "the 'ti' image carries them: forgekit images build ti --tidl tidl_tools.tar.gz)")
    if not (Path(path) / IMPORT_LIBRARY).is_file():
        return f"TIDL_TOOLS_PATH={path} has no {IMPORT_LIBRARY} (not TI's tidl_tools for this SDK)"
    python = env.get("FORGEKIT_TIDL_PYTHON", "python3")
    probe = "import onnxruntime as r; print('TIDLCompilationProvider' in r.get_available_providers())"
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return f"the Python of TI's tools ('{python}', FORGEKIT_TIDL_PYTHON) does not run"
    if out.stdout.strip() != "True":
        return (f"'{python}' (FORGEKIT_TIDL_PYTHON) has no TI onnxruntime with TIDLCompilationProvider "
                "(onnxruntime-tidl from TI's edgeai-tidl-tools setup)")
    return None


def import_options(plan: TidlPlan, tools: str, artifacts: str, *, tensor_bits: int = 8, accuracy_level: int = 1,
                   calibration_frames: int = 20, calibration_iterations: int = 50,
                   prequantized: bool = False) -> dict[str, Any]:
    """The provider options of TI's compilation provider for ``plan`` (names as edgeai-tidl-tools spells them)."""
    if tensor_bits not in (8, 16):
        raise UsageError(f"TIDL tensor bits are 8 or 16, not {tensor_bits}.")
    options: dict[str, Any] = {
        "tidl_tools_path": tools, "artifacts_folder": artifacts, "tensor_bits": tensor_bits,
        "accuracy_level": accuracy_level, "debug_level": 0,
        "max_num_subgraphs": plan.options.get("max_num_subgraphs", 16),
        "advanced_options:max_num_subgraph_nodes": plan.options.get("max_num_subgraph_nodes", 864),
        "advanced_options:calibration_frames": calibration_frames,
        "advanced_options:calibration_iterations": calibration_iterations,
        # the nodes forgekit's plan keeps on the Arm cores: TI's import then partitions as the plan says
        "deny_list:layer_name": ", ".join(plan.deny_names()),
    }
    if prequantized:  # scales come from the model's Q/DQ nodes: no TIDL calibration
        options["advanced_options:prequantized_model"] = 1
    return options


def run_tidl_import(model_path: str, plan: TidlPlan, soc: str, out: Path, samples: Sequence[dict[str, np.ndarray]],
                    *, prequantized: bool = False, env: dict[str, str] | None = None) -> list[Path]:
    """TI's import as a subprocess; returns TI's artifacts, copied to ``out``."""
    env = dict(os.environ if env is None else env)
    script = Path(__file__).with_name("tidl_import_script.py")
    with tempfile.TemporaryDirectory(prefix="forgekit-tidl-") as tmp:
        artifacts = Path(tmp) / "artifacts"
        artifacts.mkdir()
        options = import_options(plan, env["TIDL_TOOLS_PATH"], str(artifacts), prequantized=prequantized,
                                 calibration_frames=max(1, len(samples)))
        (Path(tmp) / "options.json").write_text(json.dumps(options))
        frames = {f"{name}__{k}": value for k, sample in enumerate(samples) for name, value in sample.items()}
        np.savez(Path(tmp) / "calib.npz", __count__=np.array(len(samples)), **frames)
        env.update({"SOC": soc, "LD_LIBRARY_PATH": f"{env['TIDL_TOOLS_PATH']}:{env.get('LD_LIBRARY_PATH', '')}"})
        done = subprocess.run([env.get("FORGEKIT_TIDL_PYTHON", "python3"), str(script), model_path,
                               str(Path(tmp) / "options.json"), str(Path(tmp) / "calib.npz")],
                              capture_output=True, text=True, env=env)
        if done.returncode != 0:
            last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
            raise CompileError(f"TI's TIDL import failed (exit {done.returncode}): {last}")
        found = sorted({p for pattern in ARTIFACT_PATTERNS for p in artifacts.rglob(pattern)})
        if not any(p.name.endswith("_tidl_net.bin") for p in found):
            raise CompileError(f"TI's TIDL import wrote no *_tidl_net.bin in {artifacts}: see TI's log above.")
        out.mkdir(parents=True, exist_ok=True)
        return [Path(shutil.copy2(p, out / p.name)) for p in found]


def offload_artifact(accelerator: str, model_path: str, target: str, artifact: str | Path,
                     shape_dict: dict[str, list[int]] | None = None, calib_data: Any = None) -> list[str]:
    """Plan the offload of ``model_path`` for ``target``, write ``tidl_plan.json`` into the compiled ``artifact``
    and, with TI's tools, run TI's import into ``artifact/tidl``; returns the lines to print."""
    import onnx

    from ..targets.ti import board

    check_offload(accelerator, target)
    ti = board(target)
    assert ti is not None and ti.tidl_soc is not None
    plan = plan_tidl(model_path, target, shape_dict)
    artifact = Path(artifact)
    (artifact / "tidl_plan.json").write_text(json.dumps(plan.to_dict(), indent=2) + "\n")
    lines = [*plan.summary(), f"plan: {artifact / 'tidl_plan.json'} (every node, its subgraph or why not)"]
    missing = tools_missing()
    if missing:
        return [*lines, f"TIDL import not run: {missing}; wrote the plan only."]
    model = onnx.load(model_path)
    prequantized = any(n.op_type == "QuantizeLinear" for n in model.graph.node)
    samples: list[dict[str, np.ndarray]] = []
    if not prequantized:
        if calib_data is None:
            raise UsageError("TI's import calibrates on real inputs: pass --calib-data PATH (or a Q/DQ model from "
                             "forgekit.ONNXModule.quantize, imported with prequantized_model).")
        from ..importer.load import graph_inputs
        from ..quantize.samples import iterate

        inputs = graph_inputs(model)
        names = [i.name for i in inputs]
        shapes = [(shape_dict or {}).get(i.name, i.shape) for i in inputs]
        samples = [dict(zip(names, s)) for s in iterate(calib_data, names, shapes, [i.dtype for i in inputs])]
    written = run_tidl_import(str(model_path), plan, ti.tidl_soc, artifact / "tidl", samples,
                              prequantized=prequantized)
    return [*lines, f"TIDL artifacts ({len(written)} files) in {artifact / 'tidl'}"]

