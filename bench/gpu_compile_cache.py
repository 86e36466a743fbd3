"""Warm torch.compile's caches for ``bench/gpu_run.py``'s peers in a background process.

``torch.compile`` spends 20-60 s per model and precision in Inductor's code generation and Triton's compiler;
at 16 models x precisions x 2 modes that was more than a device call's time, and a deadline left the compile
cells empty (docs/gpu.md).  gpu_run.py starts this script on the half of the cores it does not use itself
(``os.sched_setaffinity``: its own timings, host-bound at batch 1, keep theirs) while it times forgekit and
PyTorch eager; this script compiles every peer in the order gpu_run.py will, each with one call, and so fills
Inductor's FX-graph and AOTAutograd caches (``/tmp/torchinductor_$USER``, shared by both processes).  When
gpu_run.py reaches a peer, only Dynamo's tracing is left to do; one it reaches first it compiles itself.

    python bench/gpu_compile_cache.py --work /tmp/forgekit_gpu [--models ...]   (started by gpu_run.py)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="gpu_run.py's work folder (extracted pack)")
    parser.add_argument("--models", nargs="*")
    args = parser.parse_args(argv)
    sys.path[:0] = [str(args.work / "site"), str(HERE)]
    import torch
    from gpu_run import PEERS, compile_order, run_feeds, torch_peer
    from onnx2torch import convert

    runs = json.loads((args.work / "manifest.json").read_text())["runs"]
    runs = [r for r in runs if "+" not in r["precision"] and (not args.models or r["model"] in args.models)]
    for _field, mode in PEERS:
        for run in compile_order(runs) if mode else []:
            try:
                torch_peer(torch, convert, args.work / run["onnx"], run_feeds(args.work, run), run["precision"], mode)
                print(f"warm: {run['model']} b{run['batch']} {run['precision']} {mode}", flush=True)
            except Exception as exc:  # noqa: BLE001 - gpu_run.py reports the failure when it compiles it itself
                print(f"warm failed: {run['model']} b{run['batch']} {run['precision']} {mode}: {exc}", flush=True)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
