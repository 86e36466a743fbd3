"""On-device bench and tuning through TVM's own RPC: a real tracker and real servers on loopback.

The native tests run TVM's stock ``tvm.exec.rpc_server`` on this machine.  The slow ones run the aarch64
TVM wheel's server under qemu user-mode emulation in the cached arm64 rootfs (see
:mod:`forgekit.devices.rootfs`; the chroot shares the host's network, so it registers with a tracker on
127.0.0.1 like a board on the LAN would).  Every tracker and server is started in its own process group
and the whole group is killed in teardown: TVM's servers fork worker processes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import onnx
import pytest

import forgekit
from forgekit.evaluate.bench import benchmark_artifact
from forgekit.errors import RPCError, UsageError
from forgekit.devices.rpc import RpcConfig, registered_keys
from forgekit.runtime import Engine

from conftest import assert_close, make_convnet, make_two_output_model, ort_run, run_cli

HAS_CROSS = shutil.which("aarch64-linux-gnu-g++") is not None
CAN_EMULATE = HAS_CROSS and os.geteuid() == 0 and all(shutil.which(t) for t in ("debootstrap", "qemu-aarch64-static"))
needs_cross = pytest.mark.skipif(not HAS_CROSS, reason="needs g++-aarch64-linux-gnu (./dev.sh test installs it)")
needs_qemu = pytest.mark.skipif(not CAN_EMULATE, reason="needs root, debootstrap, qemu-user-static and "
                                "g++-aarch64-linux-gnu (./dev.sh test installs them)")
PI = "raspberry-pi/5"
X86_KEY = "x86-loopback"
QEMU_KEY = "qemu-aarch64"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"process exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.3)
    pytest.fail(f"nothing listens on {port} after {timeout} s: {log.read_text()[-2000:]}")


class _Group:
    """A process started in its own session, killed with all its children."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self.proc = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)


def _server_argv(python: list[str], port: int, tracker: str | None, key: str | None) -> list[str]:
    argv = [*python, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(port), "--port-end",
            str(port + 1)]
    return argv + (["--tracker", tracker, "--key", key] if tracker else [])


def _wait_registered(tracker: str, key: str, server: _Group, timeout: float) -> None:
    from tvm import rpc

    host, port = tracker.rsplit(":", 1)
    session = rpc.connect_tracker(host, int(port))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            pytest.fail(f"RPC server exited with {server.proc.returncode}: {server.log.read_text()[-2000:]}")
        if registered_keys(session).get(key):
            return
        time.sleep(0.5)
    pytest.fail(f"no server registered with key {key} after {timeout} s:\n{session.text_summary()}\n"
                f"{server.log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def tracker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    log = tmp_path_factory.mktemp("rpc") / "tracker.log"
    proc = _Group([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
                   "--port-end", str(port + 1)], log)
    try:
        _wait_port(port, proc.proc, 120, log)
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def x86_server(tracker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """TVM's RPC server on this machine, registered at the tracker with key ``x86-loopback``."""
    server = _Group(_server_argv([sys.executable], _free_port(), tracker, X86_KEY),
                    tmp_path_factory.mktemp("rpc") / "x86-server.log")
    try:
        _wait_registered(tracker, X86_KEY, server, 120)
        yield tracker
    finally:
        server.kill()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("rpc-models")
    onnx.save(make_convnet(seed=1, batch=1), folder / "convnet.onnx")
    return folder


@pytest.fixture(scope="module")
def host_artifact(model_dir: Path) -> Path:
    out = model_dir / "host"
    forgekit.from_onnx(model_dir / "convnet.onnx").compile(target="host", output_path=out)
    return out


# --------------------------------------------------------------------------- native server
def test_bench_over_tracker_matches_onnxruntime(x86_server: str, host_artifact: Path, model_dir: Path) -> None:
    result = benchmark_artifact(host_artifact, model_dir / "convnet.onnx", runs=5, warmup=1,
                                rpc_tracker=x86_server, rpc_key=X86_KEY)
    assert result.outputs_match is True
    assert result.max_abs_error is not None and result.max_abs_error < 1e-4 * result.output_scale
    assert result.forgekit.runs == 5 and 0 < result.forgekit.min_ms <= result.forgekit.median_ms
    assert result.onnxruntime is None  # onnxruntime on this machine says nothing about the board's speed
    assert result.extra["rpc"] == {"device": f"key '{X86_KEY}' at tracker {x86_server}",
                                   "remote_arch": os.uname().machine}


def test_portable_artifact_with_shared_weights(x86_server: str, tmp_path: Path) -> None:
    """A portable artifact's baseline library maps the weights file its levels share from its own directory: the
    file goes to the server next to it (under its digest-carrying name, safe on a shared server)."""
    from onnx_models import levels_model

    onnx.save(levels_model(), tmp_path / "levels.onnx")
    out = forgekit.from_onnx(tmp_path / "levels.onnx").compile(target="x86-64", output_path=tmp_path / "p").path
    assert list(out.glob("model_weights.*.bin"))
    result = benchmark_artifact(out, tmp_path / "levels.onnx", runs=2, warmup=0, rpc_tracker=x86_server,
                                rpc_key=X86_KEY)
    assert result.outputs_match is True

def test_bench_two_inputs_two_outputs(x86_server: str, tmp_path: Path) -> None:
    """Every output is fetched from the device and compared (the VM returns a tuple)."""
    onnx.save(make_two_output_model(), tmp_path / "two.onnx")
    forgekit.from_onnx(tmp_path / "two.onnx").compile(target="host", output_path=tmp_path / "two")
    result = benchmark_artifact(tmp_path / "two", tmp_path / "two.onnx", runs=2, warmup=0, rpc_tracker=x86_server,
                                rpc_key=X86_KEY)
    assert result.outputs_match is True and result.max_abs_error < 1e-6


def test_cli_bench_direct_server_and_encrypted(tmp_path: Path, model_dir: Path) -> None:
    """--rpc-host (no tracker) and an encrypted artifact, decrypted on the host before upload."""
    out = tmp_path / "enc"
    forgekit.from_onnx(model_dir / "convnet.onnx").compile(target="host", output_path=out, encrypt_password="s3cret passphrase")
    port = _free_port()
    server = _Group(_server_argv([sys.executable], port, None, None), tmp_path / "server.log")
    try:
        _wait_port(port, server.proc, 120, server.log)
        proc = run_cli("bench", str(out), "--onnx", str(model_dir / "convnet.onnx"), "--rpc-host", f"127.0.0.1:{port}",
                       "--runs", "3", "--json", str(tmp_path / "bench.json"),
                       env={"FORGEKIT_ENCRYPT_PASSWORD": "s3cret passphrase"})
    finally:
        server.kill()
    assert proc.returncode == 0, proc.stderr
    assert "outputs       match onnxruntime" in proc.stdout
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["outputs_match"] is True and data["forgekit"]["runs"] == 3
    assert data["extra"]["rpc"]["device"] == f"server 127.0.0.1:{port}"


def test_tune_on_rpc_device_records_and_builds(x86_server: str, model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "tuned"
    forgekit.from_onnx(model_dir / "convnet.onnx").compile(
        target="host", output_path=out, tuning_trials=3, records=tmp_path / "records", export_metadata=True,
        tuning_rpc=RpcConfig(tracker=x86_server, key=X86_KEY))
    report = json.loads((out / "compile_report.json").read_text())
    assert report["tuning"]["trials"] == 3 and report["tuning"]["measured_on"] == f"key '{X86_KEY}' at tracker {x86_server}"
    lines = [json.loads(x) for x in (out / "optimization_artifacts" / "records.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and all(e["seconds"] and min(e["seconds"]) > 0 for e in lines)
    shared = list((tmp_path / "records").glob("*/records.jsonl"))  # the shared cache, keyed by the target
    assert len(shared) == 1 and len(shared[0].read_text().splitlines()) == 3
    x = np.random.default_rng(0).random((1, 3, 16, 16), dtype=np.float32)
    assert_close(Engine(out).infer(x)[0], ort_run(model_dir / "convnet.onnx", {"input": x})[0])


# --------------------------------------------------------------------------- errors
def test_tracker_unreachable_is_one_line(host_artifact: Path) -> None:
    proc = run_cli("bench", str(host_artifact), "--rpc-tracker", f"127.0.0.1:{_free_port()}", "--rpc-key", "k")
    assert proc.returncode == RPCError.exit_code
    assert proc.stderr.startswith("error: Cannot reach the RPC tracker at 127.0.0.1:")
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_no_server_with_key(x86_server: str, host_artifact: Path) -> None:
    with pytest.raises(RPCError, match=f"No RPC server with key 'nosuchboard' .*registered keys: {X86_KEY}"):
        from forgekit.evaluate.bench import benchmark_remote

        benchmark_remote(host_artifact, RpcConfig(tracker=x86_server, key="nosuchboard", wait=1))


def test_all_servers_busy_is_one_line(x86_server: str, host_artifact: Path) -> None:
    """A board held by another session: the request times out instead of queueing forever."""
    from tvm import rpc

    from forgekit.evaluate.bench import benchmark_remote

    host, port = x86_server.rsplit(":", 1)
    holder = rpc.connect_tracker(host, int(port)).request(X86_KEY)  # the only x86 server is now busy
    try:
        with pytest.raises(RPCError, match=f"Every RPC server with key '{X86_KEY}' .* stayed busy for 2 s"):
            benchmark_remote(host_artifact, RpcConfig(tracker=x86_server, key=X86_KEY, busy_wait=2))
    finally:
        del holder
        import gc

        gc.collect()
    # released: the server takes new sessions again
    assert benchmark_remote(host_artifact, RpcConfig(tracker=x86_server, key=X86_KEY), runs=1).forgekit.runs == 1


@pytest.mark.parametrize("kwargs, message", [
    ({"rpc_key": "k"}, "--rpc-key needs --rpc-tracker"),
    ({"rpc_tracker": "127.0.0.1:9190"}, "--rpc-tracker needs --rpc-key"),
    ({"rpc_tracker": "localhost", "rpc_key": "k"}, "is not HOST:PORT"),
    ({"rpc_tracker": "127.0.0.1:1", "rpc_key": "k", "rpc_host": "127.0.0.1:2"}, "not both"),
])
def test_bad_rpc_options(host_artifact: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        benchmark_artifact(host_artifact, **kwargs)


def test_rpc_device_without_tuning_is_refused(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="add --tune-trials N"):
        forgekit.from_onnx(model_dir / "convnet.onnx").compile(
            target="host", output_path=tmp_path / "x", tuning_rpc=RpcConfig(tracker="127.0.0.1:9190", key="k"))
    assert not (tmp_path / "x").exists()


@needs_cross
def test_remote_arch_mismatch(x86_server: str, model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "pi"
    forgekit.from_onnx(model_dir / "convnet.onnx").compile(target=PI, output_path=out)
    with pytest.raises(RPCError, match=f"is {os.uname().machine} but '.*' is built for aarch64"):
        benchmark_artifact(out, rpc_tracker=x86_server, rpc_key=X86_KEY)


@needs_cross
def test_tuning_a_cross_target_needs_a_device(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--rpc-tracker HOST:PORT --rpc-key KEY"):
        forgekit.from_onnx(model_dir / "convnet.onnx").compile(target=PI, output_path=tmp_path / "x", tuning_trials=2)


# --------------------------------------------------------------------------- aarch64 server under qemu
@pytest.fixture(scope="module")
def qemu_server(tracker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The aarch64 TVM wheel's stock RPC server under qemu in the arm64 rootfs, key ``qemu-aarch64``."""
    from forgekit.devices import rootfs as qemu

    g = qemu.guest("aarch64")
    root = qemu.ensure_rootfs("aarch64")
    argv, env = qemu.rootfs_command(root, g, _server_argv(["/usr/bin/python3"], _free_port(), tracker, QEMU_KEY))
    server = _Group(argv, tmp_path_factory.mktemp("rpc") / "qemu-server.log", env=env)
    try:
        _wait_registered(tracker, QEMU_KEY, server, 300)  # python + TVM import twice under emulation
        yield tracker
    finally:
        server.kill()


@pytest.mark.slow
@needs_qemu
def test_bench_aarch64_artifact_under_qemu(qemu_server: str, model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "pi"
    forgekit.from_onnx(model_dir / "convnet.onnx").compile(target=PI, output_path=out)
    result = benchmark_artifact(out, model_dir / "convnet.onnx", runs=3, warmup=1, rpc_tracker=qemu_server,
                                rpc_key=QEMU_KEY)
    assert result.extra["rpc"]["remote_arch"] == "aarch64"
    assert result.outputs_match is True and result.forgekit.runs == 3


@pytest.mark.slow
@needs_qemu
def test_cli_tune_for_pi_on_qemu_board(qemu_server: str, model_dir: Path, tmp_path: Path) -> None:
    """compile --tune-trials for a cross target: candidates cross-linked here, timed on the 'board'."""
    out = tmp_path / "pi-tuned"
    proc = run_cli("compile", str(model_dir / "convnet.onnx"), "--target", PI, "--output", str(out),
                   "--tune-trials", "2", "--records", str(tmp_path / "records"), "--rpc-tracker", qemu_server,
                   "--rpc-key", QEMU_KEY)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(x) for x in (out / "optimization_artifacts" / "records.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(e["seconds"] for e in lines)
    (shared,) = (tmp_path / "records").glob("*/records.jsonl")
    assert shared.parent.name.startswith("cortex-a76-")  # keyed by the remote target, not this machine
    result = benchmark_artifact(out, model_dir / "convnet.onnx", runs=2, warmup=1, rpc_tracker=qemu_server,
                                rpc_key=QEMU_KEY)
    assert result.outputs_match is True
