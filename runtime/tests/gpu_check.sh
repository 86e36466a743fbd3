#!/usr/bin/env bash
# Runs a prebuilt forgekit-run (and capi_cuda_check) on a CUDA artifact on a GPU machine and compares the outputs
# with ones computed elsewhere (onnxruntime on the machine that compiled it).  The GPU machine needs no TVM,
# no compiler and no forgekit: only what is listed here.
#
#   runtime/tests/make_gpu_check.sh DIR        # on the forgekit machine: builds and fills DIR (about 7 MB)
#   scp -r DIR gpu:  &&  ssh gpu DIR/gpu_check.sh
#
# DIR holds (what make_gpu_check.sh writes; any CUDA artifact will do):
#   bin/forgekit-run, bin/capi_cuda_check     built with runtime/CMakeLists.txt -DFORGEKIT_BUNDLE=ON
#   lib/libforgekit_runtime.so, libtvm_ffi.so, libtvm_runtime.so, libtvm_runtime_cuda.so
#   artifact/                                 a CUDA artifact (model_library.so + metadata.json)
#   inputs/<input name>.npy                   one per model input
#   expected/<output name>.npy                the reference outputs (onnxruntime)
# The GPU machine needs: x86-64 Linux with glibc 2.36+ and libstdc++, an NVIDIA GPU the artifact's build.device
# allows (sm_90 artifact: Hopper or newer) with a CUDA 13 driver (libcuda.so.1, R580+), NVIDIA's CUDA 13 runtime
# libcudart.so.13 (found on LD_LIBRARY_PATH, in ld.so.cache, in DIR/lib, or in a Python's nvidia/cu13/lib, e.g.
# torch's nvidia-cuda-runtime wheel: set LD_LIBRARY_PATH=<site-packages>/nvidia/cu13/lib if that search misses),
# and python3 with numpy for the comparisons.
#
# Checks (each prints PASS/FAIL; the exit status is the number of failures):
#   1. forgekit-run --device cuda      outputs match expected/ (|got - ref| <= 1e-4 + 1e-3 |ref|)
#   2. forgekit-run (default device)   runs on the GPU too (metadata.json says cuda), same outputs
#   3. capi_cuda_check                 the C API: host buffers in/out, and GPU memory in/out (fk_set_input_device,
#                                      fk_get_output_device) without the runtime's copies; both match
#   4. forgekit-run --device cpu       one line, exit 16 (a CUDA artifact has no CPU kernels)
#   5. forgekit-run --device cuda:64   one line, exit 12 (no such GPU)
set -u
DIR=${1:-$(cd "$(dirname "$0")" && pwd)}
ART=$DIR/artifact
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
FAILED=0
PY=${PYTHON:-python3}

if ! ldconfig -p 2>/dev/null | grep -q 'libcudart.so.13 ' && ! [ -e "$DIR/lib/libcudart.so.13" ]; then
  # a pip-installed CUDA 13 runtime (torch, nvidia-cuda-runtime): <site-packages>/nvidia/cu13/lib
  found=$("$PY" - <<'EOF' 2>/dev/null
import glob, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + sys.path
for root in roots:
    for hit in glob.glob(f"{root}/nvidia/cu13/lib/libcudart.so.13") + glob.glob(f"{root}/nvidia/cuda_runtime/lib/libcudart.so.13"):
        print(hit.rsplit("/", 1)[0]); raise SystemExit
EOF
)
  [ -n "$found" ] && export LD_LIBRARY_PATH="$found${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" && echo "libcudart.so.13 from $found"
fi
[ -e "$DIR/lib/libcudart.so.13" ] && export LD_LIBRARY_PATH="$DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader

ARGS=()
for f in "$DIR"/inputs/*.npy; do n=$(basename "$f" .npy); ARGS+=(-i "$n=$f"); done

result() {  # name, status (0 = pass), detail
  if [ "$2" = 0 ]; then echo "PASS $1 $3"; else echo "FAIL $1 $3"; FAILED=$((FAILED + 1)); fi
}

compare() {  # outdir [suffix]: every expected/<name>.npy against outdir/<name>.npy
  "$PY" - "$DIR/expected" "$1" <<'EOF'
import glob, os, sys
import numpy as np
bad = 0
for ref_path in sorted(glob.glob(os.path.join(sys.argv[1], "*.npy"))):
    name = os.path.basename(ref_path)
    ref, got = np.load(ref_path), np.load(os.path.join(sys.argv[2], name))
    err = float(np.max(np.abs(got.astype(np.float64) - ref))) if ref.size else 0.0
    ok = got.shape == ref.shape and got.dtype == ref.dtype and np.allclose(got, ref, rtol=1e-3, atol=1e-4)
    print(f"  {name}: shape {got.shape} {got.dtype}, max abs error {err:.3g}{'' if ok else '  MISMATCH'}")
    bad += not ok
sys.exit(bad)
EOF
}

# 1. --device cuda
out=$("$DIR/bin/forgekit-run" "$ART" "${ARGS[@]}" -o "$WORK/cuda" --device cuda 2>&1); rc=$?
echo "$out" | sed 's/^/  /'
[ $rc = 0 ] && echo "$out" | grep -q "^device: cuda:0" && compare "$WORK/cuda"; result "forgekit-run --device cuda" $? "(exit $rc)"

# 2. the artifact's own device
out=$("$DIR/bin/forgekit-run" "$ART" "${ARGS[@]}" -o "$WORK/default" 2>&1); rc=$?
[ $rc = 0 ] && echo "$out" | grep -q "^device: cuda:0" && compare "$WORK/default" >/dev/null
result "forgekit-run (default device: cuda:0)" $? "(exit $rc)"

# 3. the C API, host and device memory
"$PY" - "$ART/metadata.json" "$DIR/inputs" "$WORK" <<'EOF'
import json, os, sys
import numpy as np
meta = json.load(open(sys.argv[1]))
with open(os.path.join(sys.argv[3], "inputs.txt"), "w") as listing:
    for i, spec in enumerate(meta["model"]["inputs"]):
        path = os.path.join(sys.argv[3], f"in{i}.bin")
        np.ascontiguousarray(np.load(os.path.join(sys.argv[2], spec["name"] + ".npy"))).tofile(path)
        listing.write(path + "\n")
EOF
mapfile -t BINS < "$WORK/inputs.txt"
out=$("$DIR/bin/capi_cuda_check" "$ART" cuda "$WORK/capi" "${BINS[@]}" 2>&1); rc=$?
echo "$out" | sed 's/^/  /'
if [ $rc = 0 ]; then
  "$PY" - "$ART/metadata.json" "$DIR/expected" "$WORK" <<'EOF'
import json, os, sys
import numpy as np
meta = json.load(open(sys.argv[1]))
bad = 0
for i, spec in enumerate(meta["model"]["outputs"]):
    ref = np.load(os.path.join(sys.argv[2], spec["name"] + ".npy"))
    for kind in ("host", "device"):
        got = np.fromfile(os.path.join(sys.argv[3], f"capi.{kind}.{i}.bin"), dtype=ref.dtype)
        ok = got.size == ref.size and np.allclose(got.reshape(ref.shape), ref, rtol=1e-3, atol=1e-4)
        print(f"  {spec['name']} ({kind} memory): {'ok' if ok else 'MISMATCH'}")
        bad += not ok
sys.exit(bad)
EOF
  rc=$?
fi
result "C API (fk_set_input / fk_set_input_device)" $rc ""

# 4. and 5. the one-line errors
err=$("$DIR/bin/forgekit-run" "$ART" "${ARGS[@]}" -o "$WORK/cpu" --device cpu 2>&1 >/dev/null); rc=$?
echo "  $err"
[ $rc = 16 ] && [ "$(printf '%s\n' "$err" | wc -l)" = 1 ]; result "--device cpu refused" $? "(exit $rc, want 16)"
err=$("$DIR/bin/forgekit-run" "$ART" "${ARGS[@]}" -o "$WORK/none" --device cuda:64 2>&1 >/dev/null); rc=$?
echo "  $err"
[ $rc = 12 ] && [ "$(printf '%s\n' "$err" | wc -l)" = 1 ]; result "--device cuda:64 refused" $? "(exit $rc, want 12)"

echo "$FAILED check(s) failed"
exit $FAILED
