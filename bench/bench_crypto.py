"""Benchmark forgekit's library encryption on a real >=100 MB model library and on raw bytes.

    .venv/bin/python bench/bench_crypto.py                 # 100 MiB model + 512 MiB raw file
    .venv/bin/python bench/bench_crypto.py --weights-mb 200 --raw-mb 1024 --keep /tmp/bench

Steps timed:
* scrypt key derivation at the production cost (the floor of every encrypt/decrypt/rekey);
* a real model (MatMul with a ``weights-mb`` float32 weight, exported by TVM with the weights embedded):
  encrypt, decrypt to memory, decrypt to file, and decrypt+load through memfd (``load_encrypted_module``),
  then one inference compared bit for bit with the plaintext library;
* raw AES-GCM throughput on a ``raw-mb`` file of random bytes (encrypt, decrypt to memory and to file).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forgekit import crypto  # noqa: E402
from forgekit.crypto import format as fmt  # noqa: E402

PASSWORD = "benchmark password"


def timed(label: str, fn, *args, size: int | None = None, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    seconds = time.perf_counter() - start
    rate = f"  {size / seconds / 2**20:8.0f} MiB/s" if size else ""
    print(f"  {label:<44} {seconds:8.3f} s{rate}", flush=True)
    return result, seconds


def build_model_library(path: Path, weights_mb: int) -> tuple[Path, np.ndarray]:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    import tvm
    from tvm.relax.frontend.onnx import from_onnx

    k = int((weights_mb * 2**20 / 4) ** 0.5)
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((k, k), dtype=np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "big",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, k])],
                              initializer=[numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    target = tvm.target.Target({"kind": "llvm"})
    start = time.perf_counter()
    executable = tvm.compile(from_onnx(model), target=target, relax_pipeline=tvm.relax.get_default_pipeline(target))
    executable.export_library(str(path))
    print(f"  built {path.name}: {k}x{k} float32 weight, {path.stat().st_size / 2**20:.1f} MiB library "
          f"({time.perf_counter() - start:.1f} s to compile and export)", flush=True)
    x = rng.standard_normal((1, k), dtype=np.float32)
    return path, x


def run(module, x: np.ndarray) -> np.ndarray:
    import tvm

    vm = tvm.relax.VirtualMachine(module, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights-mb", type=int, default=100, help="size of the model's weight (MiB)")
    parser.add_argument("--raw-mb", type=int, default=512, help="size of the raw random file (MiB); 0 to skip")
    parser.add_argument("--keep", type=Path, help="work directory to keep (default: a temporary one)")
    args = parser.parse_args()

    work = args.keep or Path(tempfile.mkdtemp(prefix="forgekit-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"forgekit crypto benchmark in {work} ({os.cpu_count()} CPUs)")
    try:
        print("key derivation (production cost)")
        for n in (2**15, fmt.DEFAULT_KDF_N, 2**17):
            from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

            label = f"scrypt n=2**{n.bit_length() - 1} r=8 p=1 ({128 * n * 8 >> 20} MiB)" + \
                (" [default]" if n == fmt.DEFAULT_KDF_N else "")
            timed(label, Scrypt(salt=os.urandom(16), length=32, n=n, r=8, p=1).derive, b"password")

        print("AES-256-GCM in memory (1 MiB chunks, no I/O: the cipher's own speed)")
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        aead, block, sealed = AESGCM(AESGCM.generate_key(256)), bytearray(2**20), bytearray(2**20 + 16)

        def seal(count: int) -> None:
            for i in range(count):
                aead.encrypt_into(i.to_bytes(12, "big"), block, b"aad", sealed)

        timed("encrypt 1 GiB", seal, 1024, size=2**30)

        print(f"real model library (weights {args.weights_mb} MiB)")
        import tvm

        plain, x = build_model_library(work / "model_library.so", args.weights_mb)
        size = plain.stat().st_size
        expected = run(tvm.runtime.load_module(str(plain)), x)
        enc, key = work / "model_library.so.enc", work / "modelKey.bin"
        timed("encrypt_library (incl. scrypt)", crypto.encrypt_library, plain, enc, key, PASSWORD, uuid=None,
              fingerprint="bench", target="llvm", size=size)
        data, _ = timed("decrypt_library_bytes (incl. scrypt)", crypto.decrypt_library_bytes, enc, key, PASSWORD,
                        size=size)
        assert hashlib.sha256(data).digest() == hashlib.sha256(plain.read_bytes()).digest()
        module, _ = timed("load_module_from_memory (memfd + dlopen)", crypto.load_module_from_memory, data, size=size)
        del data
        timed("decrypt_library to file (incl. scrypt)", crypto.decrypt_library, enc, key, PASSWORD,
              work / "decrypted.so", size=size)
        streamed, _ = timed("load_encrypted_module (decrypt+memfd+dlopen)", crypto.load_encrypted_module, enc, key,
                            PASSWORD, size=size)
        out, _ = timed("first inference (from the memfd-loaded library)", run, streamed, x)
        assert np.array_equal(out, expected), "outputs differ from the plaintext library"
        assert np.array_equal(run(module, x), expected)
        print("  outputs identical to the plaintext library: yes")
        (work / "decrypted.so").unlink()

        if args.raw_mb:
            print(f"raw bytes ({args.raw_mb} MiB of random data)")
            raw = work / "raw.bin"
            with open(raw, "wb") as f:
                for _ in range(args.raw_mb):
                    f.write(os.urandom(2**20))
            raw_size = raw.stat().st_size
            timed("encrypt_library", crypto.encrypt_library, raw, work / "raw.enc", work / "raw.key", PASSWORD,
                  uuid=None, fingerprint="raw", target="none", size=raw_size)
            timed("decrypt_library_bytes", crypto.decrypt_library_bytes, work / "raw.enc", work / "raw.key", PASSWORD,
                  size=raw_size)
            timed("decrypt_library to file", crypto.decrypt_library, work / "raw.enc", work / "raw.key", PASSWORD,
                  work / "raw.out", size=raw_size)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"peak RSS of this process: {peak:.0f} MiB (includes TVM and the compiled model)")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
