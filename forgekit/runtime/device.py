"""Which device an :class:`~forgekit.runtime.Engine` runs on, and what a CUDA one needs loaded first.

A CUDA artifact's host code calls TVM's CUDA runtime (``libtvm_runtime_cuda.so``, 0.4 MiB, carried next to
``libtvm_runtime.so`` by the apache-tvm wheel and by the ``forgekit-runtime`` wheel), which links against
``libcudart.so.13`` (NVIDIA's ``nvidia-cuda-runtime`` wheel, the ``forgekit-runtime[cuda]`` extra, or a CUDA
toolkit) and the driver's ``libcuda.so.1``.  Each missing piece is one line naming it (exit 12), checked
before any of the artifact's code runs; so is a GPU older than the one the kernels were built for (a
``sm_90`` fatbin does not load on an ``sm_80`` GPU: TVM would fail at the first kernel, mid-inference).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..artifact.layout import describe_device, device_of
from ..errors import IncompatibleArtifactError, NotAvailableError, UsageError

#: DLPack device types (dlpack.h)
DL_CPU, DL_CUDA = 1, 2
_KINDS = {"cpu": DL_CPU, "cuda": DL_CUDA}
#: TVM DeviceAttrKind values (tvm/runtime/device_api.h)
_ATTR_EXIST, _ATTR_COMPUTE_VERSION, _ATTR_DEVICE_NAME = 0, 4, 5
#: the libraries this process has loaded, by name (RTLD_GLOBAL cannot be undone)
_CUDA_LOADED: dict[str, ctypes.CDLL] = {}


@dataclass(frozen=True)
class Device:
    """``cpu`` or ``cuda:N``."""

    kind: str
    index: int = 0

    @property
    def dlpack_type(self) -> int:
        return _KINDS[self.kind]

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"{self.kind}:{self.index}"


def parse_device(spec: str | None, meta: dict[str, Any]) -> Device:
    """``spec`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``; None: what the artifact was built for) as a :class:`Device`;
    one line (exit 2) for a spelling it is not, one line (exit 7) for a device the artifact has no code for."""
    built = device_of(meta).get("kind", "cpu")
    if spec is None or str(spec).strip() == "":
        return Device(built if built in _KINDS else "cpu")
    kind, colon, index = str(spec).strip().lower().partition(":")
    if kind not in _KINDS or (colon and not index.isdigit()) or (kind == "cpu" and index not in ("", "0")):
        raise UsageError(f"Device '{spec}' is not one forgekit runs on: use cpu, cuda or cuda:N (N: the GPU's index).")
    device = Device(kind, int(index or 0))
    if device.kind != built:
        how = "-t cuda/sm_XX (nvidia-smi --query-gpu=compute_cap)" if device.kind == "cuda" else "a CPU target (-t host)"
        raise IncompatibleArtifactError(f"The artifact holds {built.upper()} code and cannot run on {device}: "
                                        f"recompile it with {how}, or leave the device out.")
    return device


def nvidia_roots() -> list[Path]:
    """The ``nvidia`` folders NVIDIA's pip wheels install into (a namespace package: one per site-packages),
    which the loader does not search by itself."""
    spec = importlib.util.find_spec("nvidia")
    return [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []


def _wheel_library(name: str, *subs: str) -> Path | None:
    """``name`` in the first of the wheels' ``subs`` folders (under :func:`nvidia_roots`) that has it."""
    return next((root / sub / name for root in nvidia_roots() for sub in subs if (root / sub / name).is_file()), None)


def _wheel_cudart() -> Path | None:
    """``libcudart.so.13`` from NVIDIA's pip wheels (``nvidia-cuda-runtime`` 13 puts it in nvidia/cu13/lib;
    12-era wheels used nvidia/cuda_runtime/lib)."""
    return _wheel_library("libcudart.so.13", "cu13/lib", "cuda_runtime/lib")


#: vendor libraries a CUDA artifact may link (metadata ``build.device.libraries``): where NVIDIA's wheel puts
#: each under site-packages/nvidia, and the pip package to install
VENDOR_LIBRARIES = {"libcudnn.so.9": ("cudnn/lib", "nvidia-cudnn-cu13"),
                    "libcublas.so.13": ("cu13/lib", "nvidia-cublas")}


def _load_global(name: str, path: str | Path) -> str | None:
    """dlopen ``path`` with RTLD_GLOBAL (later libraries resolve against it); the loader's message on failure."""
    if name in _CUDA_LOADED:
        return None
    try:
        _CUDA_LOADED[name] = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        return str(exc).strip().splitlines()[0]
    return None


def loaded_cudart() -> ctypes.CDLL | None:
    """The CUDA runtime :func:`ensure_cuda` loaded (the one TVM's CUDA runtime and the artifact's kernels call),
    None before a CUDA engine was made."""
    return _CUDA_LOADED.get("libcudart")


def has_nvidia_gpu() -> bool:
    """Whether the NVIDIA driver shows a GPU (its device node); no CUDA library is loaded to ask."""
    return Path("/dev/nvidia0").exists() or Path("/proc/driver/nvidia/gpus").is_dir()


def ensure_cuda(meta: dict[str, Any], device: Device, what: str, runtime_dir: Path) -> str:
    """Load the CUDA runtime pieces for ``device`` and check the GPU can run the artifact's kernels; returns
    the GPU's name.  One line (NotAvailableError, exit 12) naming what is missing and what to do."""
    import tvm_ffi

    needs = f"{what} is a CUDA artifact: it needs {describe_device(device_of(meta))}"
    if not has_nvidia_gpu():
        raise NotAvailableError(f"{needs}; none found here (no NVIDIA driver device): run it on a machine with one.")
    error = _load_global("libcuda", "libcuda.so.1")
    if error:
        raise NotAvailableError(f"{needs}; the NVIDIA driver library libcuda.so.1 does not load ({error}): install "
                                "the driver (nvidia-smi must work).")
    cudart = os.environ.get("FORGEKIT_CUDART") or _wheel_cudart() or "libcudart.so.13"
    error = _load_global("libcudart", cudart)
    if error:
        raise NotAvailableError(f"{needs}; the CUDA runtime libcudart.so.13 was not found ({error}): pip install "
                                "'forgekit-runtime[cuda]' (NVIDIA's nvidia-cuda-runtime wheel) or set FORGEKIT_CUDART.")
    if tvm_ffi.get_global_func("device_api.cuda", allow_missing=True) is None:
        library = Path(os.environ.get("FORGEKIT_TVM_RUNTIME_CUDA") or runtime_dir / "libtvm_runtime_cuda.so")
        error = _load_global("libtvm_runtime_cuda", library) if library.is_file() else f"'{library}' does not exist"
        if error:
            raise NotAvailableError(f"{needs}; TVM's CUDA runtime does not load ({error}): reinstall forgekit-runtime "
                                    "or apache-tvm, or set FORGEKIT_TVM_RUNTIME_CUDA.")
    for name in str(device_of(meta).get("libraries") or "").split():
        sub, package = VENDOR_LIBRARIES.get(name, ("", name))
        error = _load_global(name, _wheel_library(name, sub) or name) if sub else f"unknown library {name}"
        if error:
            raise NotAvailableError(f"{needs}; its kernels call {name}, which does not load ({error}): pip install "
                                    f"{package} (or 'forgekit-runtime[cudnn]'), or recompile with --gpu-kernels tvm.")
    attr = tvm_ffi.get_global_func("runtime.GetDeviceAttr")
    if not attr(DL_CUDA, device.index, _ATTR_EXIST):
        raise NotAvailableError(f"{needs}; this machine has no CUDA device {device.index} (CUDA_VISIBLE_DEVICES, "
                                "driver version?): pick another with device='cuda:N'.")
    name = str(attr(DL_CUDA, device.index, _ATTR_DEVICE_NAME))
    have = str(attr(DL_CUDA, device.index, _ATTR_COMPUTE_VERSION))  # "9.0"
    want = str(device_of(meta).get("gpu_arch") or "")  # "sm_90"
    if want.startswith("sm_") and have.replace(".", "").isdigit():
        if int(have.replace(".", "")) < int("".join(c for c in want[3:] if c.isdigit()) or 0):
            raise IncompatibleArtifactError(f"{what} was built for {want} and {device} is {name} (sm_{have.replace('.', '')}): "
                                            f"recompile it with -t cuda/sm_{have.replace('.', '')}.")
    return name
