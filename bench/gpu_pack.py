"""Pack what a GPU machine without TVM needs to run forgekit's CUDA artifacts into one small archive.

A lent GPU machine has Python 3.12, PyTorch, onnxruntime (CPU) and no TVM, and takes 64 MiB per call.  This
script (on the build machine, with the forgekit venv) compiles the zoo models (forgekit.testing.zoo) for
``cuda/sm_90`` in fp32 and fp16, and writes ``bench/gpu_pack/pack.tar.xz`` holding:

* ``wheels/``: the ``forgekit-runtime`` wheel of this checkout (Engine + libtvm_runtime{,_cuda}.so), a cp312
  ``apache-tvm-ffi`` wheel (the pinned one) and, for the PyTorch peers, ``onnx2torch`` and ``onnx``;
* ``models/*.onnx`` and ``feeds/*.npz``: each model (weights rounded to ``--levels`` values per tensor so
  that they compress: the same numerics class) and its inputs (forgekit.testing.zoo.example_feeds);
* ``artifacts/<model>-<precision>-b<batch>/``: the compiled artifacts;
* ``manifest.json``: the runs, in order.

Then, on the GPU machine, ``bench/gpu_run.py`` runs them (see its docstring)::

    .venv/bin/python bench/gpu_pack.py [--models resnet50 ...] [--batches 1 32] [--cuda-graphs bert_style ...]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "gpu_pack"
TARGET = "cuda/sm_90"  # H100/H200; the fatbin's PTX also runs on newer GPUs
CARRY_LIMIT = 64 * 2**20  # what one device call takes (ignored files carried with the tree)
PRECISIONS = ("fp32", "fp16")
TVM_FFI = "apache-tvm-ffi==0.1.14.post0"
PEER_WHEELS = ("onnx2torch==1.5.15", "onnx==1.23.2")  # onnx: the one forgekit reads models with


def download(spec: str, into: Path, python: str = "3.12") -> None:
    """One wheel (no dependencies) for the GPU machine's Python and platform."""
    done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                           "--python-version", python, "--platform", "manylinux_2_28_x86_64", "--platform",
                           "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", spec, "-d", str(into)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"pip download {spec} failed: {done.stderr.strip().splitlines()[-1:]}")


def build_wheels(into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, str(ROOT / "runtime/python/build_wheel.py"), "-o", str(into)], check=True)
    for spec in (TVM_FFI, *PEER_WHEELS):
        download(spec, into)


def compile_one(onnx_path: Path, artifact: Path, target: str, precision: str, cuda_graph: bool,
                kernels: str = "auto", layout: str | None = None) -> float:
    """Seconds to compile one artifact; ``cuda_graph``: TVM's RewriteCUDAGraph (captures the static part of the
    launch sequence once, replays it: issue 37's experiment for launch-bound small batches); ``kernels``:
    ``--gpu-kernels``; ``layout``: ``--layout`` (``last``: NHWC, cuDNN's tensor-core layout)."""
    import contextlib

    import tvm

    import forgekit as forge

    scope = (tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": True}) if cuda_graph
             else contextlib.nullcontext())
    start = time.perf_counter()
    with scope:
        forge.from_onnx(str(onnx_path)).compile(target=target, output_path=str(artifact), gpu_kernels=kernels,
                                                set_float16=precision == "fp16", set_channel_layout=layout)
    return time.perf_counter() - start


#: weight levels per model (forgekit.testing.zoo.quantize_levels): seeded models take 4 (ternary-like weights,
#: ~2 bits each after xz: ResNet-50's 25.5M weights are 6.4 MB per copy, and a pack holds three copies:
#: the ONNX, the fp32 and the fp16 artifact); PP-OCRv4's trained weights need 32 (the zoo's docstring)
LEVELS = {"ppocr_det": 32, "ppocr_rec": 32}


def compile_runs(names: list[str], batches: list[int], levels: int, work: Path, target: str = TARGET,
                 graphs: tuple[str, ...] = (), big_batch: tuple[str, ...] = (), log=print,
                 kernels: tuple[str, ...] = ("auto",), nhwc: tuple[str, ...] = ()) -> list[dict]:
    """Every model x batch x precision x variant; the first of ``kernels`` is each row's base (the one the
    PyTorch peers are timed beside), the others and the ``nhwc`` precisions (``--layout last``) are variants
    (``fp16+tvm``, ``fp16+nhwc``: forgekit's time only)."""
    from forgekit.testing.zoo import MODELS, ModelUnavailable, example_feeds

    runs = []
    for name in names:
        for batch in batches:
            if batch != 1 and name not in big_batch:
                continue  # larger batches: the throughput rows asked for only
            try:
                model = MODELS[name](batch=batch, levels=LEVELS.get(name, levels))
            except ModelUnavailable as exc:
                log(f"skip {name}: {exc}")
                continue
            onnx_path = work / "models" / f"{name}-b{batch}.onnx"
            onnx_path.parent.mkdir(parents=True, exist_ok=True)
            onnx.save(model, onnx_path)
            # batch-1 inputs only: a larger batch repeats them on the GPU machine (gpu_run.py), since random
            # images do not compress (ResNet-50's at batch 32 alone are 19 MB of the 64 MiB a call carries)
            feeds_path = work / "feeds" / f"{name}-b1.npz"
            feeds_path.parent.mkdir(parents=True, exist_ok=True)
            if not feeds_path.exists():
                one = MODELS[name](batch=1, levels=LEVELS.get(name, levels)) if batch != 1 else model
                np.savez(feeds_path, **example_feeds(one))
            for precision in PRECISIONS:
                variants = [("", kernels[0], None, False)] + [(f"+{k}", k, None, False) for k in kernels[1:]]
                variants += [("+nhwc", kernels[0], "last", False)] if precision in nhwc else []
                variants += [("+graph", kernels[0], None, True)] if name in graphs and batch == 1 else []
                for suffix, kernel, layout, graph in variants:
                    artifact = work / "artifacts" / f"{name}-{precision}-b{batch}{suffix.replace('+', '-')}"
                    try:
                        seconds = compile_one(onnx_path, artifact, target, precision, graph, kernel, layout)
                    except Exception as exc:  # noqa: BLE001 - one variant failing leaves the others to measure
                        log(f"FAILED {artifact.name}: {str(exc).strip().splitlines()[-1][:200]}")
                        continue
                    log(f"compiled {artifact.name} in {seconds:.0f} s")
                    runs.append({"model": name, "batch": batch, "precision": precision + suffix,
                                 "compile_s": round(seconds, 1), "onnx": str(onnx_path.relative_to(work)),
                                 "feeds": str(feeds_path.relative_to(work)), "repeat": batch,
                                 "gflop": round(gflop(model), 3),
                                 "artifact": str(artifact.relative_to(work))})
    return runs


def gflop(model: onnx.ModelProto) -> float:
    """Conv, ConvTranspose, MatMul and Gemm work of ``model`` in GFLOP (2 per multiply-add), from onnx's shape
    inference: the numerator of the TFLOP/s gpu_run.py reports."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    shapes.update({t.name: list(t.dims) for t in model.graph.initializer})
    macs = 0
    for node in model.graph.node:
        out = shapes.get(node.output[0]) or []
        if node.op_type in ("Conv", "ConvTranspose") and len(node.input) > 1 and node.input[1] in shapes:
            w = shapes[node.input[1]]
            spatial = int(np.prod(w[2:]))
            # Conv: every output element takes C_in/groups * k*k MACs; ConvTranspose: every input element scatters
            # C_out/groups * k*k (its weight is [C_in, C_out/groups, k, k])
            macs += int(np.prod(out)) * w[1] * spatial if node.op_type == "Conv" else \
                int(np.prod(shapes.get(node.input[0]) or [0])) * w[1] * spatial
        elif node.op_type in ("MatMul", "Gemm") and out and node.input[0] in shapes:
            a = shapes[node.input[0]]
            k = a[-1] if node.op_type == "MatMul" or not any(x.name == "transA" and x.i for x in node.attribute) else a[0]
            macs += int(np.prod(out)) * k
    return 2 * macs / 1e9


#: the "-b<N>" of a file or folder name (models/resnet50-b32.onnx, artifacts/resnet50-fp16-b32-nhwc)
BATCH = re.compile(r"-b\d+(?=[-.]|$)")


def thin_batch_models(work: Path) -> None:
    """Each larger batch's ONNX file without the initializers it shares with the batch-1 one (gpu_run.py puts them
    back, :func:`hydrate`): they are the same weights, and a copy is too far from the other (ResNet-50: 100 MB) for
    xz's 64 MiB window to find it."""
    for path in sorted((work / "models").glob("*.onnx")):
        base = path.with_name(BATCH.sub("-b1", path.name))
        if base == path or not base.exists():
            continue
        model, shared = onnx.load(path), {t.name: t for t in onnx.load(base).graph.initializer}
        keep = [t for t in model.graph.initializer if shared.get(t.name) != t]
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)
        model.metadata_props.add(key=THIN_KEY, value=base.name)
        onnx.save(model, path)


#: metadata of a thinned model: the file its other initializers are in
THIN_KEY = "gpu_pack.initializers_from"


def hydrate(models: Path) -> None:
    """Put back what :func:`thin_batch_models` took out (on the GPU machine, after unpacking)."""
    for path in sorted(models.glob("*.onnx")):
        model = onnx.load(path)
        source = next((p.value for p in model.metadata_props if p.key == THIN_KEY), None)
        if source is None:
            continue
        have = {t.name for t in model.graph.initializer}
        model.graph.initializer.extend(t for t in onnx.load(models / source).graph.initializer if t.name not in have)
        kept = [p for p in model.metadata_props if p.key != THIN_KEY]
        del model.metadata_props[:]
        model.metadata_props.extend(kept)
        onnx.save(model, path)


def pack(work: Path, archive: Path) -> int:
    """tar | xz -9 (a 64 MiB window) on every core: Python's lzma is single-threaded and took 6 minutes for a 60
    MiB pack on 2 cores.  The batches of one build are next to each other (resnet50-fp16-b1, then -b32): their
    weights repeat, and a 51 MB fp16 ResNet-50 library is found again inside the window."""
    files = sorted((str(p.relative_to(work)) for p in work.rglob("*") if p.is_file()),
                   key=lambda name: (BATCH.sub("", name), name))
    with open(archive, "wb") as out:
        tar = subprocess.Popen(["tar", "-cf", "-", "-C", str(work), *files], stdout=subprocess.PIPE)
        subprocess.run(["xz", "-9", "-T0"], stdin=tar.stdout, stdout=out, check=True)
        if tar.wait() != 0:
            raise SystemExit("tar failed")
    return archive.stat().st_size


def main(argv: list[str] | None = None) -> int:
    from forgekit.testing.zoo import MODELS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1])
    parser.add_argument("--levels", type=int, default=4, help="weight levels of the seeded models")
    parser.add_argument("--big-batch-models", nargs="*", default=["resnet50", "mobilenetv2", "bert_style"],
                        help="the models built at --batches other than 1")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--cuda-graphs", nargs="*", default=[], metavar="MODEL",
                        help="also batch-1 artifacts of these models with CUDA graphs")
    parser.add_argument("--gpu-kernels", nargs="+", default=["auto"], choices=["auto", "tvm", "cudnn", "vendor"],
                        help="the first is each row's base build, the others variants (fp32+tvm...)")
    parser.add_argument("--nhwc", nargs="*", default=[], choices=list(PRECISIONS),
                        help="also --layout last (NHWC) builds of these precisions")
    parser.add_argument("--target", default=TARGET, help="host: a pack gpu_run.py checks on this CPU (dry run)")
    args = parser.parse_args(argv)
    work = args.out / "work"
    shutil.rmtree(work, ignore_errors=True)
    build_wheels(work / "wheels")
    runs = compile_runs(args.models, args.batches, args.levels, work, args.target, tuple(args.cuda_graphs),
                        tuple(args.big_batch_models), kernels=tuple(args.gpu_kernels), nhwc=tuple(args.nhwc))
    (work / "manifest.json").write_text(json.dumps({"target": args.target, "levels": args.levels, "runs": runs}, indent=1))
    thin_batch_models(work)
    size = pack(work, args.out / "pack.tar.xz")
    print(f"{args.out / 'pack.tar.xz'}: {size / 2**20:.1f} MiB ({len(runs)} artifacts)")
    if size > CARRY_LIMIT:
        print(f"over the {CARRY_LIMIT // 2**20} MiB a device call carries: fewer models, batches or levels")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
