"""Encrypted model libraries: real TVM libraries, real AES-GCM/scrypt, real memfd loading (no mocks).

The default selection runs each property test with ~300 examples; ``-m slow`` runs the 10,000-case
versions.  Key derivation uses a cheap scrypt cost (n=16) through the ``kdf_n`` parameter; the production
default is checked separately.
"""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from forgekit import crypto
from forgekit.crypto import format as fmt
from forgekit.runtime import memload
from forgekit.errors import ArtifactError, EncryptionError, UsageError

PASSWORD = "correct horse battery staple"
CHEAP = {"kdf_n": 16, "kdf_r": 8, "kdf_p": 1}
CHUNK = 4096  # small chunks so the ~50 KB test library has a dozen of them
FAST = settings(max_examples=300, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
SLOW = settings(max_examples=10_000, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfd_create is Linux-only")


# ---------------------------------------------------------------------------------------------- fixtures
def make_model(seed: int) -> onnx.ModelProto:
    """Conv(3→4, 3x3) → Relu → Reshape → MatMul(144→5): a tiny real model with embedded weights."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal((4 * 6 * 6, 5)).astype(np.float32), "m"),
        numpy_helper.from_array(np.array([1, -1], dtype=np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Reshape", ["r", "shape"], ["f"]),
        helper.make_node("MatMul", ["f", "m"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "crypto_net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def compile_library(model: onnx.ModelProto, path: Path) -> Path:
    import tvm
    from tvm.relax.frontend.onnx import from_onnx

    target = tvm.target.Target({"kind": "llvm"})
    executable = tvm.compile(from_onnx(model), target=target, relax_pipeline=tvm.relax.get_default_pipeline(target))
    executable.export_library(str(path))
    return path


def run_module(module, x: np.ndarray) -> np.ndarray:
    import tvm

    vm = tvm.relax.VirtualMachine(module, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


@dataclass
class Lib:
    plain: Path  # the plaintext library (in its own directory)
    data: bytes
    enc: Path
    key: Path
    uuid: str
    fingerprint: str
    expected: np.ndarray  # output of the plaintext library loaded the normal way


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((1, 3, 8, 8)).astype(np.float32)


def _build(tmp_path_factory, seed: int, x: np.ndarray) -> Lib:
    import tvm

    plain_dir = tmp_path_factory.mktemp(f"plain{seed}")
    plain = compile_library(make_model(seed), plain_dir / "model_library.so")
    expected = run_module(tvm.runtime.load_module(str(plain)), x)
    enc_dir = tmp_path_factory.mktemp(f"enc{seed}")
    uuid, fingerprint = f"00000000-0000-4000-8000-00000000000{seed}", f"sha256:model-{seed}"
    crypto.encrypt_library(plain, enc_dir / "model_library.so.enc", enc_dir / "modelKey.bin", PASSWORD, uuid=uuid,
                           fingerprint=fingerprint, target='{"kind":"llvm"}', chunk_size=CHUNK, **CHEAP)
    return Lib(plain, plain.read_bytes(), enc_dir / "model_library.so.enc", enc_dir / "modelKey.bin", uuid,
               fingerprint, expected)


@pytest.fixture(scope="module")
def lib(tmp_path_factory, x) -> Lib:
    return _build(tmp_path_factory, 1, x)


@pytest.fixture(scope="module")
def other(tmp_path_factory, x) -> Lib:
    """A second, different model (other weights, uuid and fingerprint)."""
    return _build(tmp_path_factory, 2, x)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """A directory the property tests overwrite on every example (hypothesis forbids tmp_path there)."""
    return tmp_path_factory.mktemp("mutations")


def memfds() -> set[str]:
    """Links of this process's open file descriptors that are memfds."""
    out = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if link.startswith("/memfd:"):
            out.add(f"{name} -> {link}")
    return out


# ---------------------------------------------------------------------------------------------- round trips
def test_decrypt_to_memory_roundtrip(lib: Lib) -> None:
    assert lib.data.startswith(b"\x7fELF")
    assert lib.data not in lib.enc.read_bytes()
    assert crypto.decrypt_library_bytes(lib.enc, lib.key, PASSWORD) == lib.data


def test_load_from_memory_runs_identically(lib: Lib, x: np.ndarray) -> None:
    before = memfds()
    module = memload.load_module_from_memory(crypto.decrypt_library_bytes(lib.enc, lib.key, PASSWORD))
    assert memfds() == before, "the memfd must be closed after loading"
    np.testing.assert_array_equal(run_module(module, x), lib.expected)


def test_load_encrypted_module_streams_into_memory(lib: Lib, x: np.ndarray) -> None:
    """The vm_load_executable route, as a runtime without `import tvm` uses it."""
    import tvm_ffi

    before = memfds()
    module = memload.load_encrypted_module(lib.enc, lib.key, PASSWORD)
    assert memfds() == before
    vm = module["vm_load_executable"]()
    vm["vm_initialization"](1, 0, 2, 1, 0, 2)  # kDLCPU, device 0, pooled allocator (device and host)
    out = np.from_dlpack(vm["main"](tvm_ffi.from_dlpack(x)))  # x is freshly allocated: numpy aligns it to 64
    np.testing.assert_array_equal(out, lib.expected)


def test_two_models_loaded_from_memory_stay_distinct(lib: Lib, other: Lib, x: np.ndarray) -> None:
    """dlopen caches by path string: reusing /proc/self/fd/N would silently return the first model."""
    assert not np.array_equal(lib.expected, other.expected)
    first = memload.load_encrypted_module(lib.enc, lib.key, PASSWORD)
    second = memload.load_encrypted_module(other.enc, other.key, PASSWORD)
    third = memload.load_module_from_memory(lib.data)
    np.testing.assert_array_equal(run_module(first, x), lib.expected)
    np.testing.assert_array_equal(run_module(second, x), other.expected)
    np.testing.assert_array_equal(run_module(third, x), lib.expected)


def test_runtime_only_process_loads_encrypted_model(lib: Lib, x: np.ndarray, tmp_path: Path) -> None:
    """A fresh process with tvm_ffi + libtvm_runtime.so only (no `import tvm`) loads and runs the model."""
    np.save(tmp_path / "x.npy", x)
    script = textwrap.dedent(f"""
        import sys, numpy as np, tvm_ffi
        from forgekit.runtime.memload import load_encrypted_module
        module = load_encrypted_module({str(lib.enc)!r}, {str(lib.key)!r}, {PASSWORD!r})
        vm = module["vm_load_executable"]()
        vm["vm_initialization"](1, 0, 2, 1, 0, 2)
        x = np.load({str(tmp_path / "x.npy")!r})
        np.save({str(tmp_path / "y.npy")!r}, np.from_dlpack(vm["main"](tvm_ffi.from_dlpack(x))))
        assert "tvm" not in sys.modules, "the compiler package was imported"
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), lib.expected)


def test_decrypt_to_file(lib: Lib, tmp_path: Path) -> None:
    out = tmp_path / "plain.so"
    crypto.decrypt_library(lib.enc, lib.key, PASSWORD, out)
    assert out.read_bytes() == lib.data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.so"]


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK, 3 * CHUNK + 17])
def test_roundtrip_edge_sizes(tmp_path: Path, size: int) -> None:
    """Empty files, exact multiples of the chunk size and one-byte tails all round-trip."""
    data = os.urandom(size)
    (tmp_path / "p").write_bytes(data)
    info = crypto.encrypt_library(tmp_path / "p", tmp_path / "e", tmp_path / "k", PASSWORD, uuid="u",
                                  fingerprint="f", target="t", chunk_size=CHUNK, **CHEAP)
    assert info["num_chunks"] == max(1, -(-size // CHUNK))
    assert (tmp_path / "e").stat().st_size == info["header_size"] + size + 16 * info["num_chunks"]
    assert crypto.decrypt_library_bytes(tmp_path / "e", tmp_path / "k", PASSWORD) == data


def test_encrypt_in_place_and_bytes_password(lib: Lib, tmp_path: Path) -> None:
    target = tmp_path / "model_library.so"
    target.write_bytes(lib.data)
    crypto.encrypt_library(target, target, tmp_path / "modelKey.bin", "pässwörd".encode(), uuid=lib.uuid,
                           fingerprint=lib.fingerprint, target="llvm", **CHEAP)
    assert crypto.is_encrypted(target)
    assert {p.name for p in tmp_path.iterdir()} == {"model_library.so", "modelKey.bin"}
    # str passwords are NFC-normalised UTF-8: the decomposed spelling opens it too
    assert crypto.decrypt_library_bytes(target, tmp_path / "modelKey.bin", "pa\u0308sswo\u0308rd") == lib.data


def test_header_and_is_encrypted(lib: Lib, tmp_path: Path) -> None:
    header = crypto.read_header(lib.enc)
    assert header["uuid"] == lib.uuid and header["fingerprint"] == lib.fingerprint
    assert header["target"] == '{"kind":"llvm"}' and header["format_version"] == 1
    assert header["cipher"] == "AES-256-GCM" and header["chunk_size"] == CHUNK
    assert header["plaintext_size"] == len(lib.data)
    key_info = crypto.read_key_info(lib.key)
    assert key_info["key_id"] == header["key_id"] and key_info["kdf_n"] == CHEAP["kdf_n"]
    # nothing secret: neither the wrapped key nor the salt nor the nonces appear in what is returned
    secrets = {lib.key.read_bytes()[-92:-32].hex(), lib.key.read_bytes()[-92:-80].hex()}
    text = repr(header) + repr(key_info)
    assert not any(s in text for s in secrets) and "salt" not in text and "nonce" not in text
    assert crypto.is_encrypted(lib.enc)
    assert not crypto.is_encrypted(lib.plain)
    assert not crypto.is_encrypted(lib.key)
    assert not crypto.is_encrypted(tmp_path / "missing")
    assert not crypto.is_encrypted(tmp_path)


def test_production_kdf_defaults() -> None:
    assert crypto.DEFAULT_KDF_N >= 2 ** 15 and crypto.DEFAULT_KDF_R == 8 and crypto.DEFAULT_KDF_P == 1
    assert crypto.DEFAULT_CHUNK_SIZE == 1 << 20


def test_default_kdf_cost_is_used(lib: Lib, tmp_path: Path) -> None:
    crypto.encrypt_library(lib.plain, tmp_path / "e", tmp_path / "k", PASSWORD, uuid="u", fingerprint="f",
                           target="t")
    info = crypto.read_key_info(tmp_path / "k")
    assert (info["kdf_n"], info["kdf_r"], info["kdf_p"]) == (crypto.DEFAULT_KDF_N, 8, 1)
    assert crypto.read_header(tmp_path / "e")["chunk_size"] == 1 << 20
    assert crypto.decrypt_library_bytes(tmp_path / "e", tmp_path / "k", PASSWORD) == lib.data


# ---------------------------------------------------------------------------------------------- no plaintext on disk
def _snapshot(dirs: list[Path]) -> dict[Path, tuple[int, int, int]]:
    seen = {}
    for root in dirs:
        for dirpath, _, files in os.walk(root):
            for name in files:
                path = Path(dirpath) / name
                try:
                    st_ = path.lstat()
                except OSError:
                    continue
                seen[path] = (st_.st_ino, st_.st_size, st_.st_mtime_ns)
    return seen


def _assert_no_plaintext(dirs: list[Path], always: list[Path], before: dict, plain: bytes) -> int:
    """Every file created or changed since ``before`` (and every file under ``always``) lacks the plaintext."""
    digest = hashlib.sha256(plain).digest()
    checked = 0
    for path, stamp in _snapshot(dirs).items():
        if before.get(path) == stamp and not any(root in path.parents for root in always):
            continue
        if not path.is_file() or path.is_symlink() or stamp[1] > 1 << 28:
            continue
        try:
            content = path.read_bytes()
        except OSError:
            continue
        checked += 1
        assert hashlib.sha256(content).digest() != digest, f"{path} is the plaintext library"
        assert plain not in content, f"{path} contains the plaintext library"
        assert not (len(content) >= 1024 and plain.startswith(content)), f"{path} is a piece of the plaintext"
    return checked


def test_no_plaintext_written_to_disk(lib: Lib, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      x: np.ndarray) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    enc, key = work / "model_library.so.enc", work / "modelKey.bin"
    enc.write_bytes(lib.enc.read_bytes())
    key.write_bytes(lib.key.read_bytes())
    dirs = [work, out, Path(tempfile.gettempdir())] + ([Path("/dev/shm")] if Path("/dev/shm").is_dir() else [])
    before = _snapshot(dirs)
    monkeypatch.chdir(out)  # anything written relative to the working directory would land in out/

    real_loader = memload._get_loader
    during: list[int] = []

    def checking_loader():
        loader = real_loader()

        def load(path: str, kind: str):
            assert path.startswith("/proc/self/fd/")
            during.append(_assert_no_plaintext(dirs, [work, out], before, lib.data))  # while loading
            return loader(path, kind)
        return load

    monkeypatch.setattr(memload, "_get_loader", checking_loader)
    data = crypto.decrypt_library_bytes(enc, key, PASSWORD)
    _assert_no_plaintext(dirs, [work, out], before, lib.data)
    module = memload.load_module_from_memory(data)
    streamed = memload.load_encrypted_module(enc, key, PASSWORD)
    np.testing.assert_array_equal(run_module(module, x), lib.expected)
    np.testing.assert_array_equal(run_module(streamed, x), lib.expected)
    assert len(during) == 2 and min(during) >= 2  # the hook ran, and it looked at work/ at least
    assert _assert_no_plaintext(dirs, [work, out], before, lib.data) >= 2  # and after loading
    assert {p.name for p in work.iterdir()} == {"model_library.so.enc", "modelKey.bin"}
    assert list(out.iterdir()) == []


# ---------------------------------------------------------------------------------------------- errors, one each
def _raises(cls: type[Exception], fn, *args, **kwargs) -> Exception:
    with pytest.raises(cls) as info:
        fn(*args, **kwargs)
    error = info.value
    if isinstance(error, EncryptionError):
        assert error.exit_code == 11
    message = str(error)
    assert message and "\n" not in message and ":" in message, message  # one line: what is wrong: what to do
    return error


def test_key_required(lib: Lib, tmp_path: Path) -> None:
    error = _raises(crypto.KeyRequiredError, crypto.decrypt_library_bytes, lib.enc, None, PASSWORD)
    assert "Model looks encrypted but no key provided" in str(error) and "--key modelKey.bin" in str(error)
    _raises(crypto.KeyRequiredError, crypto.decrypt_library_bytes, lib.enc, lib.key, None)
    _raises(crypto.KeyRequiredError, crypto.decrypt_library_bytes, lib.enc, tmp_path / "modelKey.bin", PASSWORD)
    _raises(crypto.KeyRequiredError, memload.load_encrypted_module, lib.enc, None, PASSWORD)


def test_wrong_password(lib: Lib) -> None:
    _raises(crypto.WrongPasswordError, crypto.decrypt_library_bytes, lib.enc, lib.key, PASSWORD + "!")
    _raises(crypto.WrongPasswordError, memload.load_encrypted_module, lib.enc, lib.key, "nope")


def test_key_of_another_model(lib: Lib, other: Lib) -> None:
    error = _raises(crypto.KeyMismatchError, crypto.decrypt_library_bytes, lib.enc, other.key, PASSWORD)
    assert lib.uuid in str(error) and other.uuid in str(error)


def test_key_of_another_encryption_of_the_same_model(lib: Lib, tmp_path: Path) -> None:
    crypto.encrypt_library(lib.plain, tmp_path / "e", tmp_path / "k", PASSWORD, uuid=lib.uuid,
                           fingerprint=lib.fingerprint, target="llvm", **CHEAP)
    error = _raises(crypto.KeyMismatchError, crypto.decrypt_library_bytes, lib.enc, tmp_path / "k", PASSWORD)
    assert "another encryption" in str(error)


def test_corrupt_library(lib: Lib, tmp_path: Path) -> None:
    data = bytearray(lib.enc.read_bytes())
    data[-100] ^= 0x01
    (tmp_path / "flipped").write_bytes(data)
    _raises(crypto.CorruptArtifactError, crypto.decrypt_library_bytes, tmp_path / "flipped", lib.key, PASSWORD)
    (tmp_path / "short").write_bytes(lib.enc.read_bytes()[:-1])
    _raises(crypto.CorruptArtifactError, crypto.decrypt_library_bytes, tmp_path / "short", lib.key, PASSWORD)


def test_corrupt_key_file(lib: Lib, tmp_path: Path) -> None:
    data = bytearray(lib.key.read_bytes())
    data[-50] ^= 0x80
    (tmp_path / "key").write_bytes(data)
    error = _raises(crypto.CorruptArtifactError, crypto.decrypt_library_bytes, lib.enc, tmp_path / "key", PASSWORD)
    assert "Key file" in str(error)


def test_corrupt_header(lib: Lib, tmp_path: Path) -> None:
    data = bytearray(lib.enc.read_bytes())
    data[20] ^= 0x04  # inside the JSON header
    (tmp_path / "e").write_bytes(data)
    _raises(crypto.CorruptArtifactError, crypto.read_header, tmp_path / "e")
    _raises(crypto.CorruptArtifactError, crypto.decrypt_library_bytes, tmp_path / "e", lib.key, PASSWORD)


def test_unsupported_format_version(lib: Lib, tmp_path: Path) -> None:
    for source, name in ((lib.enc, "e"), (lib.key, "k")):
        data = bytearray(source.read_bytes())
        data[8:10] = struct.pack(">H", 2)
        (tmp_path / name).write_bytes(data)
    error = _raises(crypto.UnsupportedFormatError, crypto.decrypt_library_bytes, tmp_path / "e", lib.key, PASSWORD)
    assert "version 2" in str(error)
    _raises(crypto.UnsupportedFormatError, crypto.decrypt_library_bytes, lib.enc, tmp_path / "k", PASSWORD)
    _raises(crypto.UnsupportedFormatError, crypto.read_header, tmp_path / "e")


def test_empty_password(lib: Lib, tmp_path: Path) -> None:
    _raises(crypto.EmptyPasswordError, crypto.encrypt_library, lib.plain, tmp_path / "e", tmp_path / "k", "",
            uuid="u", fingerprint="f", target="t", **CHEAP)
    assert list(tmp_path.iterdir()) == []
    _raises(crypto.EmptyPasswordError, crypto.decrypt_library_bytes, lib.enc, lib.key, "")
    _raises(crypto.EmptyPasswordError, crypto.rekey, lib.key, PASSWORD, b"")


def test_not_an_encrypted_library(lib: Lib) -> None:
    error = _raises(crypto.NotEncryptedError, crypto.decrypt_library_bytes, lib.plain, lib.key, PASSWORD)
    assert isinstance(error, crypto.CorruptArtifactError)
    swapped = _raises(crypto.NotEncryptedError, crypto.decrypt_library_bytes, lib.key, lib.enc, PASSWORD)
    assert "order of the arguments" in str(swapped)


def test_missing_files_and_bad_arguments(lib: Lib, tmp_path: Path) -> None:
    _raises(ArtifactError, crypto.decrypt_library_bytes, tmp_path / "nothing.enc", lib.key, PASSWORD)
    _raises(ArtifactError, crypto.encrypt_library, tmp_path / "nothing.so", tmp_path / "e", tmp_path / "k", PASSWORD,
            uuid="u", fingerprint="f", target="t")
    _raises(UsageError, crypto.encrypt_library, lib.plain, tmp_path / "e", tmp_path / "e", PASSWORD, uuid="u",
            fingerprint="f", target="t")
    _raises(UsageError, crypto.encrypt_library, lib.plain, tmp_path / "e", tmp_path / "k", PASSWORD, uuid="u",
            fingerprint="f", target="t", kdf_n=1000)
    _raises(ArtifactError, crypto.encrypt_library, lib.plain, tmp_path / "no" / "e", tmp_path / "k", PASSWORD,
            uuid="u", fingerprint="f", target="t")
    _raises(ArtifactError, crypto.decrypt_library, lib.enc, lib.key, PASSWORD, tmp_path / "no" / "plain.so")
    assert list(tmp_path.iterdir()) == []
    error = _raises(UsageError, crypto.encrypt_library, lib.enc, tmp_path / "e", tmp_path / "k", PASSWORD,
                    uuid="u", fingerprint="f", target="t")
    assert "already" in str(error)
    assert list(tmp_path.iterdir()) == []


def test_hostile_kdf_parameters_are_refused(lib: Lib, tmp_path: Path) -> None:
    """A key file asking for 2**30 scrypt iterations is refused before any derivation (no DoS)."""
    data = lib.key.read_bytes()
    body_len = struct.unpack(">I", data[10:14])[0]
    body = data[14:14 + body_len].replace(b'"kdf_n":16', b'"kdf_n":1073741824')
    head = data[:10] + struct.pack(">I", len(body)) + body
    forged = head + data[14 + body_len:-32]
    (tmp_path / "k").write_bytes(forged + hashlib.sha256(forged).digest())
    _raises(crypto.CorruptArtifactError, crypto.decrypt_library_bytes, lib.enc, tmp_path / "k", PASSWORD)


# ---------------------------------------------------------------------------------------------- rekey, atomicity
def test_rekey_roundtrip(lib: Lib, tmp_path: Path) -> None:
    enc, key = tmp_path / "e", tmp_path / "k"
    crypto.encrypt_library(lib.plain, enc, key, PASSWORD, uuid=lib.uuid, fingerprint=lib.fingerprint, target="t",
                           **CHEAP)
    library_before, key_before = enc.read_bytes(), key.read_bytes()
    _raises(crypto.WrongPasswordError, crypto.rekey, key, "not it", "new password", **CHEAP)
    assert key.read_bytes() == key_before
    crypto.rekey(key, PASSWORD, "new password", kdf_n=32, kdf_r=4, kdf_p=2)
    assert enc.read_bytes() == library_before  # the library is untouched
    assert key.read_bytes() != key_before
    info = crypto.read_key_info(key)
    assert (info["kdf_n"], info["kdf_r"], info["kdf_p"]) == (32, 4, 2)
    assert info["key_id"] == crypto.read_header(enc)["key_id"]
    _raises(crypto.WrongPasswordError, crypto.decrypt_library_bytes, enc, key, PASSWORD)  # old password refused
    assert crypto.decrypt_library_bytes(enc, key, "new password") == lib.data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e", "k"]


def test_failed_write_leaves_nothing(lib: Lib, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(fmt.os, "replace", boom)
    with pytest.raises(OSError):
        crypto.encrypt_library(lib.plain, tmp_path / "e", tmp_path / "k", PASSWORD, uuid="u", fingerprint="f",
                               target="t", **CHEAP)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(OSError):
        crypto.decrypt_library(lib.enc, lib.key, PASSWORD, tmp_path / "plain.so")
    assert list(tmp_path.iterdir()) == []


def test_failed_decryption_to_file_leaves_nothing(lib: Lib, tmp_path: Path) -> None:
    data = bytearray(lib.enc.read_bytes())
    data[-1] ^= 1  # the last chunk fails, after the others were written to the temporary file
    (tmp_path / "e").write_bytes(data)
    with pytest.raises(crypto.CorruptArtifactError):
        crypto.decrypt_library(tmp_path / "e", lib.key, PASSWORD, tmp_path / "plain.so")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e"]


def test_tampered_library_is_not_loaded(lib: Lib, tmp_path: Path) -> None:
    data = bytearray(lib.enc.read_bytes())
    data[-1] ^= 1
    (tmp_path / "e").write_bytes(data)
    before = memfds()
    with pytest.raises(crypto.CorruptArtifactError):
        memload.load_encrypted_module(tmp_path / "e", lib.key, PASSWORD)
    assert memfds() == before


def test_unloadable_bytes_raise_artifact_error() -> None:
    before = memfds()
    error = _raises(ArtifactError, memload.load_module_from_memory, b"\x7fELF not really a library")
    assert "compiled for this machine" in str(error)
    assert memfds() == before


# ---------------------------------------------------------------------------------------------- passwords
def test_password_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORGEKIT_ENCRYPT_PASSWORD", raising=False)
    (tmp_path / "pw").write_text("s3cret\n")
    assert crypto.password_from_env_or_file(tmp_path / "pw") == "s3cret"
    (tmp_path / "pw2").write_text(" spaced  \r\n")
    assert crypto.password_from_env_or_file(tmp_path / "pw2") == " spaced  "
    (tmp_path / "empty").write_text("\n")
    _raises(crypto.EmptyPasswordError, crypto.password_from_env_or_file, tmp_path / "empty")
    _raises(crypto.KeyRequiredError, crypto.password_from_env_or_file, tmp_path / "missing")
    monkeypatch.setenv("FORGEKIT_ENCRYPT_PASSWORD", "from-env")
    assert crypto.password_from_env_or_file() == "from-env"
    assert crypto.password_from_env_or_file(tmp_path / "pw") == "s3cret"  # the file wins
    monkeypatch.setenv("FORGEKIT_ENCRYPT_PASSWORD", "")
    _raises(crypto.EmptyPasswordError, crypto.password_from_env_or_file)
    monkeypatch.delenv("FORGEKIT_ENCRYPT_PASSWORD")
    monkeypatch.setattr(sys, "stdin", open(os.devnull))  # not a terminal: no prompt
    _raises(crypto.KeyRequiredError, crypto.password_from_env_or_file)


# ---------------------------------------------------------------------------------------------- property tests
def _expected_error(mutated: bytes, magic: bytes) -> type[Exception]:
    """The exact error class a randomly damaged file must produce."""
    if mutated[:8] != magic:
        return crypto.NotEncryptedError
    if len(mutated) >= 10 and mutated[8:10] != b"\x00\x01":
        return crypto.UnsupportedFormatError
    return crypto.CorruptArtifactError


def mutations(original: bytes, chunk_starts: list[int] | None = None) -> st.SearchStrategy:
    """(name, mutated bytes): flips, truncation, extension, overwrites, deletions and chunk splices."""
    # ``original`` is captured, not passed to the composite, so hypothesis never builds its 50 kB repr
    return _mutation_strategy(original, chunk_starts)()


def _mutation_strategy(original: bytes, chunk_starts: list[int] | None):
    @st.composite
    def draw_mutation(draw):
        return _mutate(draw, original, chunk_starts)
    return draw_mutation


def _mutate(draw, original: bytes, chunk_starts: list[int] | None):
    n = len(original)
    kinds = ["flip", "flip_many", "truncate", "extend", "overwrite", "delete", "insert"]
    if chunk_starts:
        kinds += ["swap_chunks", "duplicate_chunk", "drop_chunk"]
    kind = draw(st.sampled_from(kinds))
    data = bytearray(original)
    if kind == "flip":
        i = draw(st.integers(0, n - 1))
        data[i] ^= draw(st.integers(1, 255))
    elif kind == "flip_many":
        for i in draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=20)):
            data[i] ^= 1 << draw(st.integers(0, 7))
    elif kind == "truncate":
        data = data[:draw(st.integers(0, n - 1))]
    elif kind == "extend":
        data += draw(st.binary(min_size=1, max_size=CHUNK + 64))
    elif kind == "overwrite":
        i = draw(st.integers(0, n - 1))
        patch = draw(st.binary(min_size=1, max_size=64))
        data[i:i + len(patch)] = patch
    elif kind == "delete":
        i = draw(st.integers(0, n - 1))
        del data[i:i + draw(st.integers(1, 64))]
    elif kind == "insert":
        i = draw(st.integers(0, n))
        data[i:i] = draw(st.binary(min_size=1, max_size=64))
    else:
        step = CHUNK + 16
        full = [s for s in chunk_starts if s + step <= n]  # type: ignore[union-attr]
        a, b = draw(st.lists(st.sampled_from(full), min_size=2, max_size=2, unique=True))
        chunk_a, chunk_b = original[a:a + step], original[b:b + step]
        if kind == "swap_chunks":
            data[a:a + step], data[b:b + step] = chunk_b, chunk_a
        elif kind == "duplicate_chunk":
            data[b:b] = chunk_a
        else:
            del data[a:a + step]
    mutated = bytes(data)
    assume(mutated != original)
    return kind, mutated


def _check_library_mutation(lib: Lib, scratch: Path, mutated: bytes) -> None:
    path = scratch / "lib.enc"
    path.write_bytes(mutated)
    expected = _expected_error(mutated, fmt.LIBRARY_MAGIC)
    with pytest.raises(EncryptionError) as info:  # anything else (a crash, success) fails the test
        crypto.decrypt_library_bytes(path, lib.key, PASSWORD)
    assert type(info.value) is expected, (type(info.value), str(info.value))


def _check_key_mutation(lib: Lib, scratch: Path, mutated: bytes) -> None:
    path = scratch / "modelKey.bin"
    path.write_bytes(mutated)
    expected = _expected_error(mutated, fmt.KEY_MAGIC)
    with pytest.raises(EncryptionError) as info:
        crypto.decrypt_library_bytes(lib.enc, path, PASSWORD)
    assert type(info.value) is expected, (type(info.value), str(info.value))


def _chunk_starts(lib: Lib) -> list[int]:
    header = crypto.read_header(lib.enc)
    return [header["header_size"] + i * (CHUNK + 16) for i in range(header["num_chunks"])]


def _library_property(lib: Lib, scratch: Path, config: settings) -> None:
    original = lib.enc.read_bytes()

    @config
    @given(mutations(original, _chunk_starts(lib)))
    def check(case):
        _check_library_mutation(lib, scratch, case[1])

    check()


def _key_property(lib: Lib, scratch: Path, config: settings) -> None:
    original = lib.key.read_bytes()

    @config
    @given(mutations(original))
    def check(case):
        _check_key_mutation(lib, scratch, case[1])

    check()


def _forged_property(lib: Lib, other: Lib, scratch: Path, config: settings) -> None:
    """An attacker who edits the header or key file *and* fixes the unkeyed checksum is still refused.

    Depending on the edit that is CorruptArtifactError (AAD/tag/field check), KeyMismatchError (identity
    fields now differ) or, for the key file, WrongPasswordError (KEK from edited salt/params): never success.
    """
    lib_bytes, key_bytes = lib.enc.read_bytes(), lib.key.read_bytes()
    header_end = crypto.read_header(lib.enc)["header_size"] - 32
    key_end = len(key_bytes) - 32
    allowed = (crypto.CorruptArtifactError, crypto.KeyMismatchError, crypto.WrongPasswordError,
               crypto.UnsupportedFormatError)

    @config
    @given(st.booleans(), st.integers(10, 10_000), st.binary(min_size=1, max_size=8), st.booleans())
    def check(in_library, position, patch, foreign_chunks):
        source = lib_bytes if in_library else key_bytes
        end = header_end if in_library else key_end
        i = 10 + position % (end - 10)  # past magic and version
        head = bytearray(source[:end])
        head[i:i + len(patch)] = patch
        assume(bytes(head) != source[:end])
        forged = bytes(head) + hashlib.sha256(head).digest()
        if in_library:
            body = other.enc.read_bytes()[crypto.read_header(other.enc)["header_size"]:] if foreign_chunks \
                else lib_bytes[end + 32:]
            (scratch / "forged.enc").write_bytes(forged + body)
            paths = (scratch / "forged.enc", lib.key)
        else:
            (scratch / "forged.key").write_bytes(forged)
            paths = (lib.enc, scratch / "forged.key")
        with pytest.raises(EncryptionError) as info:
            crypto.decrypt_library_bytes(*paths, PASSWORD)
        assert isinstance(info.value, allowed), (type(info.value), str(info.value))

    check()


def test_library_mutations_are_refused(lib: Lib, scratch: Path) -> None:
    _library_property(lib, scratch, FAST)


def test_key_file_mutations_are_refused(lib: Lib, scratch: Path) -> None:
    _key_property(lib, scratch, FAST)


def test_forged_checksums_are_refused(lib: Lib, other: Lib, scratch: Path) -> None:
    _forged_property(lib, other, scratch, FAST)


@settings(max_examples=50, deadline=None, database=None)
@given(st.binary(max_size=3 * 512 + 7), st.sampled_from([256, 512, 1000]))
def test_roundtrip_property(data: bytes, chunk_size: int) -> None:
    assume(not data.startswith(fmt.LIBRARY_MAGIC))  # that is refused as "already encrypted"
    with tempfile.TemporaryDirectory() as d:
        p = Path(d)
        (p / "p").write_bytes(data)
        crypto.encrypt_library(p / "p", p / "e", p / "k", PASSWORD, uuid="u", fingerprint="f", target="t",
                               chunk_size=chunk_size, **CHEAP)
        assert crypto.decrypt_library_bytes(p / "e", p / "k", PASSWORD) == data


@pytest.mark.slow
def test_library_mutations_are_refused_10k(lib: Lib, scratch: Path) -> None:
    _library_property(lib, scratch, SLOW)


@pytest.mark.slow
def test_key_file_mutations_are_refused_10k(lib: Lib, scratch: Path) -> None:
    _key_property(lib, scratch, SLOW)


@pytest.mark.slow
def test_forged_checksums_are_refused_10k(lib: Lib, other: Lib, scratch: Path) -> None:
    _forged_property(lib, other, scratch, SLOW)
