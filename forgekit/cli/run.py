"""``forgekit run``: an artifact on inputs, a summary of its outputs and its latency."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any, Optional

import numpy as np
import typer

from ..errors import UsageError
from .app import app, command
from .options import (CudaGraphsOpt, DeviceOpt, InputOpt, KeyOpt, PasswordFileOpt, fmt_shape, password_if_encrypted,
                      read_input_files)


def load_inputs(engine: Any, specs: list[str] | None, random: bool) -> list[np.ndarray]:
    """``--input name=file.npy`` / ``file.npy`` / ``file.npz`` (or ``--random``) as the model's input list."""
    from ..runtime.inputs import arrange_inputs

    if random:
        if specs:
            raise UsageError("Give either --input files or --random, not both.")
        return engine.example_inputs(random=True)
    if not specs:
        raise UsageError("No inputs: pass --input name=file.npy (or file.npz), or --random.")
    return arrange_inputs(engine.input_names, read_input_files(specs))


def summarize(name: str, array: np.ndarray) -> str:
    """One line describing an output: shape, dtype, range, and top-5 classes for score vectors."""
    text = f"{name}: {fmt_shape(array.shape)} {array.dtype}"
    if array.size and np.issubdtype(array.dtype, np.number):
        text += f" min={array.min():.4g} max={array.max():.4g} mean={array.mean():.4g}"
        # A score vector (one dimension larger than 1, e.g. 1x1000x1x1) gets its top-5 classes.
        big = [d for d in array.shape if d > 1]
        if len(big) == 1 and 10 <= big[0] <= 100000:
            flat = array.reshape(-1)
            top = np.argsort(flat)[::-1][:5]
            text += " top5=" + ",".join(f"{i}:{flat[i]:.3g}" for i in top)
    return text


@app.command()
@command
def run(
    artifact: Annotated[str, typer.Argument(metavar="ARTIFACT", help="Artifact directory (or model_library.so).")],
    inputs: InputOpt = None,
    random: Annotated[bool, typer.Option("--random", help="Run on random inputs of the right shapes.")] = False,
    save: Annotated[Optional[str], typer.Option("--save", metavar="FILE", help="Write the outputs to this .npz.")] = None,
    bench: Annotated[int, typer.Option("--bench", min=0, metavar="N", help="Also time N runs.")] = 10,
    key: KeyOpt = None,
    password_file: PasswordFileOpt = None,
    device: DeviceOpt = None,
    cuda_graphs: CudaGraphsOpt = False,
) -> None:
    """Run an artifact on inputs, print a summary of the outputs and the latency."""
    from ..runtime import Engine

    start = time.perf_counter()
    engine = Engine(artifact, key_path=key, password=password_if_encrypted(artifact, password_file), device=device,
                    cuda_graphs=cuda_graphs)
    load_ms = (time.perf_counter() - start) * 1e3
    feeds = load_inputs(engine, inputs, random)
    outputs = engine.infer(*feeds)
    names = engine.output_names or [f"output_{i}" for i in range(len(outputs))]
    for name, array in zip(names, outputs):
        print(summarize(name, array))
    if save:
        save_path = Path(save)
        if save_path.exists():
            raise UsageError(f"'{save}' exists: choose another file name.")
        try:
            np.savez(save_path, **dict(zip(names, outputs)))
        except OSError as exc:
            from ..artifact.outputs import write_error

            raise write_error(save_path, exc) from None
        print(f"outputs saved to {save_path}")
    if bench:
        stats = engine.benchmark(n=bench, warmup=1, inputs=feeds)
        print(f"latency: median {stats['median_ms']:.2f} ms, p90 {stats['p90_ms']:.2f} ms over {bench} runs "
              f"(load {load_ms:.0f} ms)")
    print(f"artifact: {Path(artifact).absolute()}")
    if engine.device_name:  # a CUDA artifact: which GPU ran it
        print(f"device: {engine.device} ({engine.device_name})")
    if engine.level is not None:  # a portable artifact: which of its instruction-set levels this CPU runs
        print(f"level: {engine.level} ({engine.library_path.name}), chosen for this CPU")
