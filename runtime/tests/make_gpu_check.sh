#!/usr/bin/env bash
# Fills DIR with what runtime/tests/gpu_check.sh needs on a GPU machine (read its header): the C runtime built
# with -DFORGEKIT_BUNDLE=ON (libraries found through $ORIGIN, the wheel's TVM libraries copied next to them, no
# OpenSSL), a CUDA artifact of a small model, its inputs and onnxruntime's outputs.  Run from a forgekit checkout
# with its .venv (cmake, g++, nvcc; no GPU needed):
#
#   runtime/tests/make_gpu_check.sh DIR [MODEL.onnx] [TARGET]     # TARGET default cuda/sm_90
#
# Without MODEL.onnx it makes a Conv + Relu + MatMul model (static shapes).  DIR is replaced.
set -euo pipefail
DEST=${1:?usage: make_gpu_check.sh DIR [MODEL.onnx] [TARGET]}
MODEL=${2:-}
TARGET=${3:-cuda/sm_90}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=$ROOT/.venv/bin/python
rm -rf "$DEST" && mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)
BUILD=$(mktemp -d)
trap 'rm -rf "$BUILD"' EXIT
cmake -S "$ROOT/runtime" -B "$BUILD" -DPython3_EXECUTABLE="$PY" -DFORGEKIT_BUNDLE=ON -DFORGEKIT_ENCRYPTION=OFF >/dev/null
cmake --build "$BUILD" -j2 >/dev/null
cmake --install "$BUILD" --prefix "$DEST" --strip >/dev/null
cp "$ROOT/runtime/tests/gpu_check.sh" "$DEST/"
"$PY" - "$DEST" "$MODEL" "$TARGET" <<'PYEOF'
import os, subprocess, sys
import numpy as np, onnx, onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
dest, model_path, target = sys.argv[1], sys.argv[2], sys.argv[3]
if not model_path:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((16, 10)).astype(np.float32), "m")]
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                               helper.make_node("Relu", ["c"], ["r"]),
                               helper.make_node("MatMul", ["r", "m"], ["y"])], "gpu_check",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 16, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model_path = os.path.join(dest, "model.onnx")
    onnx.save(model, model_path)
subprocess.run([sys.executable, "-m", "forgekit", "compile", model_path, "-t", target, "-o",
                os.path.join(dest, "artifact")], check=True, stdout=subprocess.DEVNULL)
session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(1)
feeds = {}
os.makedirs(os.path.join(dest, "inputs")), os.makedirs(os.path.join(dest, "expected"))
for spec in session.get_inputs():
    shape = [d if isinstance(d, int) else 1 for d in spec.shape]
    dtype = np.float32 if "float" in spec.type else np.int64
    feeds[spec.name] = rng.standard_normal(shape).astype(dtype) if dtype == np.float32 else np.zeros(shape, dtype)
    np.save(os.path.join(dest, "inputs", spec.name + ".npy"), feeds[spec.name])
for spec, value in zip(session.get_outputs(), session.run(None, feeds)):
    np.save(os.path.join(dest, "expected", spec.name + ".npy"), value)
PYEOF
du -sh "$DEST"
