"""Compile an imported model with TVM and compare it with onnxruntime.

``onnxruntime`` is imported lazily: it is a test/verification dependency only.
Command line: ``python -m importer.verify model.onnx --shape x=1,3,320,320``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping

import numpy as np
import onnx
from onnx import helper

from .check import _load, import_onnx
from .prepare import graph_inputs, value_shape

TARGET = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}


def default_target():
    import tvm

    return tvm.target.Target(TARGET)


def compile_module(mod, target=None):
    import tvm

    t = target or default_target()
    return tvm.compile(mod, target=t, relax_pipeline=tvm.relax.get_default_pipeline(t))


def make_inputs(
    model: onnx.ModelProto,
    seed: int = 0,
    int_high: int | Mapping[str, int] = 100,
    overrides: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Seeded inputs for a model whose inputs are static (a prepared model).

    floats ~ N(0, 1); integer inputs ~ U[0, int_high); bool inputs all True.
    """
    rng = np.random.default_rng(seed)
    out = {}
    for vi in graph_inputs(model):
        if overrides and vi.name in overrides:
            out[vi.name] = np.asarray(overrides[vi.name])
            continue
        shape = value_shape(vi)
        if shape is None or not all(isinstance(d, int) for d in shape):
            raise ValueError(f"input {vi.name} is not static: {shape}")
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
        if dt.kind == "f":
            out[vi.name] = rng.standard_normal(shape).astype(dt)
        elif dt.kind in "iu":
            hi = int_high.get(vi.name, 100) if isinstance(int_high, Mapping) else int_high
            out[vi.name] = rng.integers(0, hi, size=shape).astype(dt)
        elif dt.kind == "b":
            out[vi.name] = np.ones(shape, dtype=dt)
        else:
            raise ValueError(f"unsupported input dtype {dt} for {vi.name}")
    return out


def _flatten(x) -> list[np.ndarray]:
    import tvm

    if isinstance(x, tvm.runtime.Tensor):
        return [x.numpy()]
    if isinstance(x, (list, tuple)) or hasattr(x, "__len__") and not isinstance(x, np.ndarray):
        res = []
        for item in x:
            res.extend(_flatten(item))
        return res
    return [np.asarray(x)]


def run_tvm(ex, model: onnx.ModelProto, inputs: Mapping[str, np.ndarray], repeat: int = 1):
    """Run a compiled module; inputs are fed in ``model``'s graph-input order."""
    import tvm
    from tvm import relax

    dev = tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(np.ascontiguousarray(inputs[vi.name]), dev) for vi in graph_inputs(model)]
    t0 = time.perf_counter()
    out = vm["main"](*args)
    dt = time.perf_counter() - t0
    if repeat > 1:
        t0 = time.perf_counter()
        for _ in range(repeat - 1):
            vm["main"](*args)
        dt = (time.perf_counter() - t0) / (repeat - 1)
    return _flatten(out), dt


def run_ort(model: onnx.ModelProto, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    return [np.asarray(o) for o in sess.run(None, {k: v for k, v in inputs.items() if k in names})]


@dataclasses.dataclass
class VerifyResult:
    ok: bool
    max_abs: float
    max_rel: float  # max |tvm-ort| / max |ort|, per output, maximum over outputs
    outputs: int
    import_s: float
    compile_s: float
    run_s: float
    detail: str = ""

    def summary(self) -> str:
        return (
            f"{'OK ' if self.ok else 'BAD'} outputs={self.outputs} max_abs={self.max_abs:.3g} "
            f"max_rel={self.max_rel:.3g} import={self.import_s:.1f}s compile={self.compile_s:.1f}s "
            f"run={self.run_s * 1e3:.1f}ms {self.detail}"
        )


def compare(got: list[np.ndarray], ref: list[np.ndarray], rtol: float, atol: float):
    if len(got) != len(ref):
        return False, float("inf"), float("inf"), f"{len(got)} outputs vs {len(ref)}"
    ok, max_abs, max_rel, detail = True, 0.0, 0.0, []
    for i, (g, r) in enumerate(zip(got, ref)):
        if g.shape != r.shape:
            return False, float("inf"), float("inf"), f"output {i}: shape {g.shape} vs {r.shape}"
        if r.size == 0:
            continue
        if r.dtype == bool or g.dtype == bool:
            diff = np.abs(g.astype(np.int64) - r.astype(np.int64))
        else:
            diff = np.abs(g.astype(np.float64) - r.astype(np.float64))
        ma = float(diff.max())
        scale = float(np.abs(r.astype(np.float64)).max())
        mr = ma / scale if scale > 0 else ma
        max_abs, max_rel = max(max_abs, ma), max(max_rel, mr)
        good = np.allclose(g.astype(np.float64), r.astype(np.float64), rtol=rtol, atol=atol)
        if not good:
            ok = False
            detail.append(f"output {i} max_abs={ma:.3g}")
    return ok, max_abs, max_rel, "; ".join(detail)


def verify(
    model,
    shape_dict=None,
    *,
    inputs: Mapping[str, np.ndarray] | None = None,
    input_fn: Callable[[onnx.ModelProto], dict] | None = None,
    rtol: float = 1e-3,
    atol: float = 1e-4,
    seed: int = 0,
    repeat: int = 1,
    target=None,
    **import_kwargs,
) -> VerifyResult:
    """import -> compile -> run with TVM; run onnxruntime on the *original* model; compare."""
    from .prepare import prepare_onnx

    model = _load(model)
    t0 = time.perf_counter()
    mod = import_onnx(model, shape_dict, **import_kwargs)
    t1 = time.perf_counter()
    ex = compile_module(mod, target)
    t2 = time.perf_counter()
    prepared = prepare_onnx(
        model, shape_dict, fold=False, **{k: v for k, v in import_kwargs.items() if k in ("freeze", "default_batch")}
    )
    if inputs is None:
        inputs = input_fn(prepared) if input_fn else make_inputs(prepared, seed)
    got, run_s = run_tvm(ex, prepared, inputs, repeat=repeat)
    feeds = dict(inputs)
    in_types = {vi.name: vi.type.tensor_type for vi in model.graph.input}
    for k, v in (import_kwargs.get("freeze") or {}).items():
        tt = in_types[k]
        arr = np.asarray(v, dtype=helper.tensor_dtype_to_np_dtype(tt.elem_type))
        feeds[k] = arr.reshape([d.dim_value for d in tt.shape.dim]) if arr.size == 1 and tt.HasField("shape") else arr
    ref = run_ort(model, feeds)
    ok, ma, mr, detail = compare(got, ref, rtol, atol)
    return VerifyResult(ok, ma, mr, len(ref), t1 - t0, t2 - t1, run_s, detail)


def main(argv=None):
    import argparse

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("model")
    p.add_argument("--shape", action="append", default=[], help="name=d0,d1,... or symbol=value")
    p.add_argument("--rtol", type=float, default=1e-3)
    p.add_argument("--atol", type=float, default=1e-4)
    a = p.parse_args(argv)
    sd = {}
    for s in a.shape:
        k, v = s.split("=", 1)
        vals = [int(x) for x in v.split(",")]
        sd[k] = vals if "," in v else vals[0] if k not in {i.name for i in onnx.load(a.model).graph.input} else vals
    r = verify(a.model, sd or None, rtol=a.rtol, atol=a.atol)
    print(r.summary())
    return 0 if r.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
