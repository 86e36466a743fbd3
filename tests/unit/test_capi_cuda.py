"""The C runtime on CUDA artifacts (issue 36): fk_open_ex / forgekit-run --device, TVM's CUDA runtime loaded with
dlopen, and publish --with-runtime of a CUDA artifact.  This machine has no GPU and no libcuda.so.1, so the real
dlopen of libtvm_runtime_cuda.so fails here and must become one line with exit 12; on a machine with a GPU the
same tests check the outputs instead (runtime/tests/gpu_check.sh does that from a copied build folder)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from conftest import ort_run
from onnx_models import tiny_conv_model
from forgekit.deploy.capi import SOURCE_DIR, build_capi, build_program


def _have_nvcc() -> bool:
    from forgekit.backends.cuda.nvcc import _wheel_nvcc

    return bool(os.environ.get("CUDA_HOME") or shutil.which("nvcc") or _wheel_nvcc())


def _have_gpu() -> bool:
    return Path("/dev/nvidia0").exists()


pytestmark = [pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build the C runtime"),
              pytest.mark.skipif(not _have_nvcc(), reason="needs nvcc (pip install 'forgekit[cuda]')")]
GPU_LINE = "is a CUDA artifact: it needs an NVIDIA GPU sm_90 (Hopper) with a CUDA 13.0 driver (R580 or newer)"


@pytest.fixture(scope="module")
def capi(tmp_path_factory):
    return build_capi(tmp_path_factory.mktemp("capi_cuda"))


@pytest.fixture(scope="module")
def cuda_artifact(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("cuda_art")
    onnx.save(tiny_conv_model(), folder / "m.onnx")
    done = subprocess.run([sys.executable, "-m", "forgekit", "compile", str(folder / "m.onnx"), "-t", "cuda/sm_90",
                           "-o", str(folder / "out")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return folder / "out"


@pytest.fixture(scope="module")
def cpu_artifact(tmp_path_factory) -> Path:
    import forgekit

    out = tmp_path_factory.mktemp("cpu_art") / "out"
    forgekit.from_onnx(tiny_conv_model(), {"x": [1, 3, 8, 8]}).compile(target="host", output_path=out)
    return out


@pytest.fixture(scope="module")
def x_npy(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("x") / "x.npy"
    np.save(path, np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32))
    return path


def run(program: Path, artifact: Path, x: Path, out: Path, *extra: str, env: dict[str, str] | None = None):
    return subprocess.run([str(program), str(artifact), "-i", f"x={x}", "-o", str(out), *extra], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def one_line(done: subprocess.CompletedProcess, code: int, *parts: str) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == code and len(lines) == 1, (done.returncode, done.stderr)
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def test_cuda_artifact_without_a_gpu_is_one_line_exit_12(capi, cuda_artifact, x_npy, tmp_path) -> None:
    """The default device is the artifact's (cuda:0): libtvm_runtime_cuda.so is really dlopen()ed, and the
    driver's libcuda.so.1 it needs is absent here."""
    for extra in ([], ["--device", "cuda"], ["--device", "cuda:0"]):
        done = run(capi.program, cuda_artifact, x_npy, tmp_path / "o", *extra)
        if _have_gpu():
            assert done.returncode == 0 and "device: cuda:0" in done.stdout, done.stderr
            expected = ort_run(tiny_conv_model(), {"x": np.load(x_npy)})[0]
            np.testing.assert_allclose(np.load(tmp_path / "o" / "y.npy"), expected, rtol=1e-4, atol=1e-4)
            continue
        line = one_line(done, 12, "forgekit-run: error: ", GPU_LINE, "none found here", "libcuda.so.1")
        assert "forgekit-run: error: " in line
    assert _have_gpu() or not (tmp_path / "o").exists()


def test_device_choices_are_checked(capi, cuda_artifact, cpu_artifact, x_npy, tmp_path) -> None:
    one_line(run(capi.program, cuda_artifact, x_npy, tmp_path / "o", "--device", "cpu"), 16,
             "was compiled for an NVIDIA GPU sm_90", "cannot run on the CPU")
    one_line(run(capi.program, cpu_artifact, x_npy, tmp_path / "o", "--device", "cuda"), 16,
             "was compiled for the CPU: it cannot run on a GPU")
    one_line(run(capi.program, cpu_artifact, x_npy, tmp_path / "o", "--device", "tpu"), 2,
             "Unknown device 'tpu': use cpu, cuda or cuda:N")
    one_line(run(capi.program, cpu_artifact, x_npy, tmp_path / "o", "--device", "cuda:x"), 2, "Unknown device")
    # the CPU path as before: --device cpu is the default of a CPU artifact, same bits, no "device:" line
    for extra in ([], ["--device", "cpu"]):
        done = run(capi.program, cpu_artifact, x_npy, tmp_path / "cpu", *extra)
        assert done.returncode == 0 and "device:" not in done.stdout, done.stderr
        expected = ort_run(tiny_conv_model(), {"x": np.load(x_npy)})[0]
        np.testing.assert_allclose(np.load(tmp_path / "cpu" / "y.npy"), expected, rtol=1e-5, atol=1e-5)


def test_cuda_runtime_location_and_libcudart(capi, cuda_artifact, x_npy, tmp_path) -> None:
    one_line(run(capi.program, cuda_artifact, x_npy, tmp_path / "o", env={"FORGEKIT_TVM_RUNTIME_CUDA":
                                                                          str(tmp_path / "none.so")}),
             12, GPU_LINE, f"TVM's CUDA runtime '{tmp_path / 'none.so'}' cannot be loaded")
    if _have_gpu():
        return
    # NVIDIA's wheel's libcudart.so.13 first on the path: the dlopen then stops at the driver, as on a GPU-less
    # server with the CUDA runtime installed
    cudart = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / \
        "site-packages" / "nvidia" / "cu13" / "lib"
    if (cudart / "libcudart.so.13").is_file():
        one_line(run(capi.program, cuda_artifact, x_npy, tmp_path / "o", env={"LD_LIBRARY_PATH": str(cudart)}),
                 12, GPU_LINE, "libcuda.so.1")


def test_c_api_open_ex_and_old_fk_open(capi, cuda_artifact, cpu_artifact, x_npy, tmp_path) -> None:
    """capi_cuda_check (C99, fk_open_ex + fk_parse_device + fk_model_device) on the CPU artifact gives
    onnxruntime's output; on the CUDA artifact the one-line refusal.  The old fk_open (capi_check.c, unchanged)
    opens a CUDA artifact on its own device too, so it is refused the same way here."""
    program = build_program(SOURCE_DIR / "tests" / "capi_cuda_check.c", capi)
    x = np.load(x_npy)
    x.tofile(tmp_path / "x.bin")
    done = subprocess.run([str(program), str(cpu_artifact), "cpu", str(tmp_path / "cpu"), str(tmp_path / "x.bin")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("device 1 0\n"), done.stderr
    got = np.fromfile(tmp_path / "cpu.host.0.bin", np.float32).reshape(1, 4, 8, 8)
    np.testing.assert_allclose(got, ort_run(tiny_conv_model(), {"x": x})[0], rtol=1e-5, atol=1e-5)
    done = subprocess.run([str(program), str(cuda_artifact), "default", str(tmp_path / "gpu"), str(tmp_path / "x.bin")],
                          capture_output=True, text=True, timeout=60)
    if not _have_gpu():
        one_line(done, 12, GPU_LINE)
        old = build_program(SOURCE_DIR / "tests" / "capi_check.c", capi)
        done = subprocess.run([str(old), str(cuda_artifact)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 12 and done.stdout.startswith("status open 12 ") and GPU_LINE in done.stdout


def test_publish_with_runtime_ships_the_cuda_runtime(cuda_artifact, x_npy, tmp_path) -> None:
    """The bundle's runtime/ has TVM's CUDA runtime next to forgekit-run and its README says what the server
    brings; unpacked elsewhere, its forgekit-run finds its libraries ($ORIGIN) and refuses in one line here."""
    from forgekit.release.publish import publish

    result = publish([cuda_artifact], "1.0.0", tmp_path / "dist", with_runtime=True, name="conv")
    assert result.notes == []
    top = "conv-1.0.0-cuda-sm_90"
    names = set(result.bundles[0].members)
    assert {f"runtime/{n}" for n in ("forgekit-run", "libforgekit_runtime.so", "libtvm_ffi.so", "libtvm_runtime.so",
                                     "libtvm_runtime_cuda.so", "README.md", "include/forgekit_runtime.h")} <= names
    assert not any("libcudart" in n for n in names)  # the server's own, matching its driver
    with tarfile.open(result.bundles[0].archive, "r:gz") as tar:
        tar.extractall(tmp_path / "unpacked", filter="tar")
    bundle = tmp_path / "unpacked" / top
    card, readme = (bundle / "MODEL_CARD.md").read_text(), (bundle / "runtime" / "README.md").read_text()
    assert f"./{top}/runtime/forgekit-run {top} -i x=x.npy -o out/ --device cuda" in card
    assert "libcudart.so.13" in readme and "nvidia-cuda-runtime" in readme and "libcuda.so.1" in readme
    assert "runtime/libtvm_runtime_cuda.so" in (bundle / "SHA256SUMS").read_text()
    done = run(bundle / "runtime" / "forgekit-run", bundle, x_npy, tmp_path / "o")
    if _have_gpu():
        assert done.returncode == 0, done.stderr
    else:
        one_line(done, 12, GPU_LINE, "libcuda.so.1")
    meta = json.loads((bundle / "metadata.json").read_text())
    assert meta["build"]["device"]["kind"] == "cuda"


def test_gpu_check_script_runs_from_a_copied_folder(tmp_path) -> None:
    """make_gpu_check.sh builds the folder gpu_check.sh runs from; here, without a GPU, only the two refusals
    pass (three checks fail with exit 12), which proves the folder's binaries load from anywhere."""
    if shutil.which("cmake") is None:
        pytest.skip("needs cmake")
    made = subprocess.run([str(SOURCE_DIR / "tests" / "make_gpu_check.sh"), str(tmp_path / "made")],
                          capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr
    moved = shutil.move(tmp_path / "made", tmp_path / "elsewhere")  # nothing absolute in the binaries
    size = sum(p.stat().st_size for p in Path(moved).rglob("*") if p.is_file())
    assert size < 10_000_000
    done = subprocess.run([str(Path(moved) / "gpu_check.sh")], capture_output=True, text=True, timeout=300)
    if _have_gpu():
        assert done.returncode == 0, done.stdout + done.stderr
        return
    assert done.returncode == 3, done.stdout + done.stderr
    assert "PASS --device cpu refused" in done.stdout and "PASS --device cuda:64 refused" in done.stdout
    assert "FAIL forgekit-run --device cuda" in done.stdout and "libcuda.so.1" in done.stdout


def test_publish_with_runtime_refuses_a_cuda_artifact_on_an_aarch64_host(tmp_path) -> None:
    """jetson/orin (an aarch64 host with an sm_87 GPU): the bundle got this machine's x86-64 forgekit-run and
    libtvm_runtime_cuda.so next to an aarch64 library, silently.  Now one line (exit 12) and nothing written."""
    if shutil.which("aarch64-linux-gnu-g++") is None:
        pytest.skip("needs the aarch64 cross compiler (g++-aarch64-linux-gnu) to build a jetson/orin artifact")
    onnx.save(tiny_conv_model(), tmp_path / "m.onnx")
    done = subprocess.run([sys.executable, "-m", "forgekit", "compile", str(tmp_path / "m.onnx"), "-t", "jetson/orin",
                           "-o", str(tmp_path / "art")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([sys.executable, "-m", "forgekit", "publish", str(tmp_path / "art"), "--with-runtime",
                           "--version", "1.0.0", "-o", str(tmp_path / "dist")], capture_output=True, text=True)
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 12 and len(lines) == 1, done.stderr
    assert "cannot build the C runtime for a CUDA artifact on an aarch64 host (jetson/orin)" in lines[0]
    assert not (tmp_path / "dist").exists() or not any((tmp_path / "dist").iterdir())
