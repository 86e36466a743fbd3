"""CUDA kernels are compiled by nvcc at build time (forgekit/nvcc.py, devpack.py, families/cuda.py).

There is no GPU on the test machines: these tests build real libraries and inspect the embedded device
code (fatbin entries, their architectures, the CUDA ELF inside) instead of running them.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit as forge
from forgekit.errors import TargetError, ToolchainError

def _have_nvcc() -> bool:
    from forgekit.backends.cuda.nvcc import _wheel_nvcc

    return bool(os.environ.get("CUDA_HOME") or shutil.which("nvcc") or _wheel_nvcc())


# dev.sh installs forgekit[cuda] (NVIDIA's nvcc wheels), so this only skips outside the project's setup.
pytestmark = pytest.mark.skipif(not _have_nvcc(), reason="needs nvcc (pip install 'forgekit[cuda]')")

FATBIN_MAGIC = 0xBA55ED50
EM_AARCH64, EM_X86_64, EM_CUDA = 183, 62, 190
ENTRY_PTX, ENTRY_ELF = 1, 2


def fatbin_entries(library: Path) -> list[tuple[str, int]]:
    """(``"ptx"``/``"elf"``, sm number) of every entry of every fatbin embedded in ``library``.

    Layout (CUDA's fatbinary.h): header u32 magic, u16 version, u16 header size, u64 size; then entries
    of u16 kind, u16, u32 header size, u64 payload size, ..., u32 arch at offset 28.  ELF entries must be
    CUDA ELF (e_machine 190) whose e_flags name the same sm.
    """
    data = library.read_bytes()
    entries, start = [], data.find(struct.pack("<I", FATBIN_MAGIC))
    while start >= 0:
        _, _, header, size = struct.unpack_from("<IHHQ", data, start)
        pos, end = start + header, start + header + size
        while pos < end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, pos)
            (arch,) = struct.unpack_from("<I", data, pos + 28)
            if kind == ENTRY_ELF:
                elf = pos + entry_header
                assert data[elf:elf + 4] == b"\x7fELF"
                assert struct.unpack_from("<H", data, elf + 18)[0] == EM_CUDA
                (flags,) = struct.unpack_from("<I", data, elf + 48)
                assert arch in (flags & 0xFF, (flags >> 8) & 0xFF)  # old / new CUDA ELF ABI
            entries.append(({ENTRY_PTX: "ptx", ENTRY_ELF: "elf"}[kind], arch))
            pos += entry_header + payload
        start = data.find(struct.pack("<I", FATBIN_MAGIC), end)
    return entries


def elf_machine(library: Path) -> int:
    return struct.unpack_from("<H", library.read_bytes(), 18)[0]


def matmul_model(path: Path) -> Path:
    """x[4,64] @ W[64,32] + b, then Relu: a GEMM kernel for DLight's matmul/GEMV rules."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"]),
         helper.make_node("Relu", ["z"], ["out"])],
        "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, 32])],
        initializer=[numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "w"),
                     numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def models(convnet_path, tmp_path_factory):
    matmul = matmul_model(tmp_path_factory.mktemp("cuda") / "matmul.onnx")
    return {"convnet": forge.from_onnx(convnet_path, {"input": [2, 3, 16, 16]}), "matmul": forge.from_onnx(matmul)}


def assert_compiled_kernels(library: Path, sm: int) -> None:
    data = library.read_bytes()
    assert b'extern "C" __global__' not in data, "CUDA source left in the library: it would be JIT-compiled"
    entries = fatbin_entries(library)
    assert ("elf", sm) in entries, entries  # SASS for the target GPU
    assert ("ptx", sm) in entries, entries  # PTX for newer GPUs
    assert all(arch == sm for _, arch in entries)


@pytest.mark.parametrize("model", ["convnet", "matmul"])
def test_cuda_sm80_library_embeds_a_fatbin(models, model, tmp_path) -> None:
    result = models[model].compile(target="cuda -arch=sm_80", output_path=tmp_path / "out")
    assert_compiled_kernels(result.library, 80)
    assert elf_machine(result.library) == {"x86_64": EM_X86_64, "aarch64": EM_AARCH64}[os.uname().machine]
    toolchain = result.metadata["build"]["toolchain"]
    assert toolchain["cuda_arch"] == "sm_80" and toolchain["device_code"] == "fatbin"
    assert toolchain["nvcc_version"].split(".")[0].isdigit()


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-g++") is None,
                    reason="needs g++-aarch64-linux-gnu (./dev.sh test installs it)")
@pytest.mark.parametrize(("target", "model"), [("jetson/orin", "convnet"), ("nvidia/jetson-agx-orin-64gb", "matmul")])
def test_jetson_library_is_aarch64_with_sm87_kernels(models, target, model, tmp_path) -> None:
    result = models[model].compile(target=target, output_path=tmp_path / "jetson")
    assert elf_machine(result.library) == EM_AARCH64  # host code cross-linked for the Jetson's CPU
    assert_compiled_kernels(result.library, 87)
    meta = result.metadata["build"]
    assert meta["arch"] == "aarch64" and meta["toolchain"]["linker"] == "aarch64-linux-gnu-g++"
    assert meta["triple"] == "aarch64-linux-gnu" and meta["cpu"] == "cortex-a78" and meta["gpu_arch"] == "sm_87"
    assert meta["toolchain"]["nvcc_version"] and meta["toolchain"]["linker_version"]


def test_low_opt_levels_still_build_gpu_kernels(models, tmp_path) -> None:
    """Levels 0-1 skip fusion but must still schedule every operator onto the GPU."""
    result = models["matmul"].compile(target="cuda/sm_86", output_path=tmp_path / "o0", opt_level=0)
    assert_compiled_kernels(result.library, 86)


def test_callback_is_scoped_to_the_build(models, tmp_path) -> None:
    """With a GPU driver TVM calls tvm_callback_cuda_compile while building: forgekit's returns a
    fatbin, and TVM's own callback is back afterwards."""
    import tvm_ffi

    from forgekit.backends.cuda.nvcc import scoped_compile_callback

    name = "tvm_callback_cuda_compile"
    before = tvm_ffi.get_global_func(name)
    with scoped_compile_callback("sm_80"):
        inside = tvm_ffi.get_global_func(name)
        assert not inside.same_as(before)
        out = bytes(inside('extern "C" __global__ void k(float* x) { x[threadIdx.x] += 1.0f; }'))
        assert struct.unpack_from("<I", out)[0] == FATBIN_MAGIC
    assert tvm_ffi.get_global_func(name).same_as(before)
    models["matmul"].compile(target="cuda -arch=sm_80", output_path=tmp_path / "again")
    assert tvm_ffi.get_global_func(name).same_as(before)


def test_dropped_arch_names_the_cuda_version(models, tmp_path) -> None:
    from forgekit.backends.cuda.nvcc import find_nvcc

    release = subprocess.run([find_nvcc(), "--list-gpu-code"], capture_output=True, text=True).stdout
    if "sm_72" in release.split():
        pytest.skip("this nvcc still builds sm_72")
    with pytest.raises(ToolchainError, match=r"cannot build for sm_72 .*CUDA 12\.x or older"):
        models["matmul"].compile(target="jetson/xavier", output_path=tmp_path / "xavier")
    assert not (tmp_path / "xavier").exists()


def test_cuda_without_arch_is_a_target_error(models, tmp_path) -> None:
    with pytest.raises(TargetError, match="-arch=sm_XY"):
        models["matmul"].compile(target="cuda", output_path=tmp_path / "noarch")


def test_missing_nvcc_is_one_line(monkeypatch) -> None:
    """No nvcc anywhere (no CUDA_HOME, none on PATH, no forgekit[cuda] wheels): one line naming the ways
    to get it, exit code 10."""
    import forgekit.backends.cuda.nvcc as nvcc_mod

    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    monkeypatch.setattr(nvcc_mod, "_wheel_nvcc", lambda: None)
    with pytest.raises(ToolchainError) as info:
        nvcc_mod.find_nvcc()
    message = str(info.value)
    assert "'nvcc' is not installed" in message and "forgekit[cuda]" in message and "nvidia-cuda-toolkit" in message
    assert "\n" not in message and info.value.exit_code == 10


def test_wrong_cuda_home_is_one_line_before_any_build(convnet_path, tmp_path) -> None:
    """CUDA_HOME without bin/nvcc: exit code 10 and one line, no traceback, nothing written."""
    env = {**os.environ, "CUDA_HOME": str(tmp_path / "no-toolkit")}
    proc = subprocess.run([sys.executable, "-m", "forgekit", "compile", str(convnet_path), "--target",
                           "cuda -arch=sm_80", "-o", str(tmp_path / "x")], capture_output=True, text=True, env=env)
    assert proc.returncode == ToolchainError.exit_code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "has no bin/nvcc" in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "x").exists()


def test_nvcc_from_the_cuda_extra_wheels_is_found(monkeypatch) -> None:
    """pip install 'forgekit[cuda]' is enough: nvcc is found in site-packages/nvidia/cu*/bin."""
    import forgekit.backends.cuda.nvcc as nvcc_mod

    wheel = nvcc_mod._wheel_nvcc()
    if wheel is None:
        pytest.skip("the forgekit[cuda] wheels are not installed in this environment")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    assert nvcc_mod.find_nvcc() == wheel
    assert nvcc_mod.nvcc_version(wheel).startswith("13.")


def test_devpack_rewrites_only_cuda_source_modules() -> None:
    """The blob rewrite keeps other modules byte for byte and refuses a layout it does not know."""
    from forgekit.backends.cuda.devpack import compile_cuda_payloads
    from forgekit.errors import CompileError

    def s(b: bytes) -> bytes:
        return struct.pack("<Q", len(b)) + b

    source = b'extern "C" __global__ void k() {}'
    fmap = struct.pack("<Q", 1) + s(b"k") + s(b"k") + struct.pack("<Q", 0) * 3
    body = (struct.pack("<6Q", 3, 0, 1, 1, 1, 1) + s(b"relax.VMExecutable") + s(b"vm-bytes") + s(b"_lib")
            + s(b"cuda") + s(s(b"cuda") + fmap + s(source)))
    blob, count = compile_cuda_payloads(struct.pack("<Q", len(body)) + body, lambda src: b"FATBIN:" + src.encode())
    assert count == 1
    assert s(b"vm-bytes") in blob and s(s(b"fatbin") + fmap + s(b"FATBIN:" + source)) in blob
    assert struct.unpack_from("<Q", blob)[0] == len(blob) - 8
    again, count = compile_cuda_payloads(blob, lambda src: pytest.fail("compiled twice"))
    assert count == 0 and again == blob
    with pytest.raises(CompileError, match="blob layout"):
        compile_cuda_payloads(b"\x00" * 16, lambda src: b"")
