"""The runtime a published bundle carries for its device (``publish(..., with_runtime=True)``).

Targets with a cross-built runtime (aarch64 and armhf Linux, Android: :mod:`forgekit.deploy.cross`) get
``runtime/`` with ``libtvm_ffi.so``, ``libtvm_runtime.so``, ``libforgekit_runtime.so``, ``forgekit-run`` and
the C/C++ headers, so a board needs neither Python nor forgekit: unpack, then
``./runtime/forgekit-run . -i x.npy -o out/`` in the bundle's folder (``forgekit-run`` finds its libraries
next to itself, ``$ORIGIN``).  CUDA targets get the x86-64 runtime with TVM's CUDA runtime
(:mod:`.cuda_runtime`), and their card says what the GPU server must bring (libcudart.so.13, the driver).
Other targets (x86-64, where the ``forgekit-runtime`` wheel exists) get no binaries, and their card names the
wheel instead.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from ..artifact.layout import device_of
from ..errors import NotAvailableError, TargetError
from .archive import FILE_MODE, Member

RUNTIME_DIR = "runtime"
HEADERS = ("forgekit_runtime.h", "forgekit_runtime.hpp")
EXEC_MODE = 0o755


def is_cuda(meta: dict[str, Any] | None) -> bool:
    """Whether metadata.json says the artifact runs on an NVIDIA GPU (build.device.kind, or the family)."""
    return bool(meta) and device_of(meta).get("kind") == "cuda"


def runtime_members(target: str, log: Callable[[str], None] | None = None,
                    meta: dict[str, Any] | None = None) -> list[Member]:
    """The bundle members of ``target``'s device runtime; [] for a target that installs the wheel instead.
    ``meta``: the artifact's metadata, which tells a CUDA artifact (its runtime is this machine's build plus
    TVM's CUDA runtime) and an encrypted one (that runtime then links libcrypto)."""
    from ..deploy.capi import SOURCE_DIR
    from ..deploy.cross import build_cross_runtime
    from ..deploy.cross_toolchains import toolchain_for
    from .cuda_runtime import build_cuda_runtime

    if is_cuda(meta):
        arch = str((meta or {}).get("build", {}).get("arch") or "x86_64")
        if arch != "x86_64":  # the CUDA runtime here is built by this x86-64 machine's g++ (.cuda_runtime)
            raise NotAvailableError(
                f"publish --with-runtime cannot build the C runtime for a CUDA artifact on an {arch} host ({target}) "
                "yet: publish without --with-runtime, and on the device use the forgekit-runtime wheel or build "
                "runtime/ there with CMake (docs/deployment.md).")
        encrypted = bool((meta or {}).get("library", {}).get("encrypted"))
        files = build_cuda_runtime(encryption=encrypted, log=log)
    else:
        try:
            toolchain_for(target)
        except TargetError:
            return []
        files = list(build_cross_runtime(target, log=log).files)
    members = [Member(f"{RUNTIME_DIR}/{path.name}", path, EXEC_MODE if os.access(path, os.X_OK) else FILE_MODE)
               for path in files]
    members += [Member(f"{RUNTIME_DIR}/include/{name}", SOURCE_DIR / "include" / name) for name in HEADERS]
    return sorted(members, key=lambda m: m.name)


#: where pip puts NVIDIA's CUDA 13 runtime (the nvidia-cuda-runtime wheel, also a dependency of torch's cu13 builds)
_CUDART_DIR = "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')/nvidia/cu13/lib"


def device_commands(bundle: str, members: list[Member], inputs: list[dict[str, Any]],
                    encrypted: bool, meta: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The card's "Run it on the device" section, three commands with this model's inputs; None without
    binaries.  The cross-built runtime has no OpenSSL, so the card says an encrypted bundle needs the wheel.
    A CUDA bundle's commands also get NVIDIA's CUDA runtime (libcudart.so.13) onto the library path, since
    the bundle does not ship it, and run on the GPU (``--device cuda``)."""
    if not members:
        return None
    names = [str(t.get("name")) for t in inputs]
    files = " ".join(f"{n}.npy" for n in names)
    args = " ".join(f"-i {n}={n}.npy" for n in names)
    run = f"./{bundle}/{RUNTIME_DIR}/forgekit-run {bundle} {args} -o out/"
    if not is_cuda(meta):
        return {"commands": [f"scp {bundle}.tar.gz {files} device:    # from your machine; inputs saved with numpy.save",
                             f"tar xzf {bundle}.tar.gz                 # on the device",
                             f"{run}   # out/<output>.npy"],
                "encrypted": encrypted, "include": f"{RUNTIME_DIR}/include", "lib": RUNTIME_DIR}
    from ..artifact.layout import describe_device

    gpu = describe_device(device_of(meta or {}))
    # an artifact whose convolutions call cuDNN (build.device.libraries) needs NVIDIA's wheel of it too
    cudnn = "libcudnn.so.9" in str(device_of(meta or {}).get("libraries") or "").split()
    wheels = "'nvidia-cuda-runtime==13.*'" + (" 'nvidia-cudnn-cu13==9.*'" if cudnn else "")
    path = _CUDART_DIR + (":" + _CUDART_DIR.replace("/nvidia/cu13/lib", "/nvidia/cudnn/lib") if cudnn else "")
    # the cross-built runtime's "no decryption" note does not apply: this runtime links libcrypto when encrypted
    return {"commands": [f"# {README_FILE}: what the server needs; {RUNTIME_DIR}/ also holds TVM's CUDA runtime, "
                         "libtvm_runtime_cuda.so",
                         f"scp {bundle}.tar.gz {files} gpu-server:    # from your machine; inputs saved with numpy.save",
                         f"tar xzf {bundle}.tar.gz                     # on the server: {gpu}",
                         "# the server brings NVIDIA's driver (libcuda.so.1) and CUDA 13 runtime (libcudart.so.13): "
                         "the CUDA 13",
                         "# toolkit, or the nvidia-cuda-runtime wheel (skip these two lines when ldconfig -p lists "
                         "libcudart.so.13)",
                         f"pip install {wheels}",
                         f"export LD_LIBRARY_PATH={path}",
                         f"{run} --device cuda   # GPU 0 (cuda:N for another); out/<output>.npy",
                         "# no GPU, driver or libcudart: one line saying which, exit 12"
                         + ("; an encrypted bundle needs libcrypto.so.3 (OpenSSL 3) and the password in "
                            "FORGEKIT_ENCRYPT_PASSWORD" if encrypted else "")],
            "encrypted": False, "include": f"{RUNTIME_DIR}/include", "lib": RUNTIME_DIR}


#: the CUDA bundle's own instructions, next to the binaries (the model card's section is generic to all devices)
README_FILE = f"{RUNTIME_DIR}/README.md"


def cuda_readme(bundle: str, device: dict[str, Any], meta: dict[str, Any]) -> str:
    """``runtime/README.md`` of a CUDA bundle: what the GPU server needs, the commands, the C API."""
    from ..artifact.layout import describe_device

    gpu = describe_device(device_of(meta))
    commands = "\n".join(device["commands"])
    return f"""# Running {bundle} on an NVIDIA GPU

This folder runs the model without Python, TVM or a compiler: `forgekit-run` (inputs and outputs as `.npy`
files), the C API `libforgekit_runtime.so` (headers in `include/`; `fk_open_ex` with `FK_DEVICE_CUDA`, or the
C++ `forgekit::Model(path, forgekit::Device::cuda(0))`), the TVM runtime (`libtvm_ffi.so`, `libtvm_runtime.so`)
and TVM's CUDA runtime `libtvm_runtime_cuda.so`, built for x86-64 Linux (glibc 2.36 or newer). Each finds the
others in this folder.

The server brings what comes with its GPU, which this bundle does not ship:

- {gpu};
- the NVIDIA driver's `libcuda.so.1` (installed with the driver);
- NVIDIA's CUDA 13 runtime `libcudart.so.13`: the CUDA 13 toolkit, or `pip install 'nvidia-cuda-runtime==13.*'`
  (PyTorch's CUDA 13 builds install it too) with its `nvidia/cu13/lib` folder on `LD_LIBRARY_PATH`;
- when the metadata's `build.device.libraries` names `libcudnn.so.9` (convolutions on cuDNN), cuDNN 9:
  `pip install 'nvidia-cudnn-cu13==9.*'` with its `nvidia/cudnn/lib` folder on `LD_LIBRARY_PATH`, or NVIDIA's
  `libcudnn9-cuda-13` package.

```sh
{commands}
```

`--device cuda` is the default for this artifact (its `metadata.json` says `build.device.kind: cuda`);
`--device cuda:1` picks another GPU. When the server lacks the GPU, the driver or libcudart, `forgekit-run`
prints one line naming what is missing and exits 12; an older GPU than the artifact's architecture exits 16.
`FORGEKIT_TVM_RUNTIME_CUDA=/path/libtvm_runtime_cuda.so` loads another build of TVM's CUDA runtime.
"""
