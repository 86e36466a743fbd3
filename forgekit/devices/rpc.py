"""On-device sessions through TVM's own RPC: a tracker that hands out boards by key, or one server.

A board runs TVM's stock server (``python3 -m tvm.exec.rpc_server --tracker HOST:PORT --key KEY``,
from the apache-tvm wheel plus ``cloudpickle``), the compiling machine or a lab machine runs TVM's stock
tracker (``python -m tvm.exec.rpc_tracker``, needs ``tornado``), and forgekit is only a client: it asks the
tracker for a session with a board of ``KEY``, uploads a library, loads it there and times it with the
remote ``time_evaluator``.  No protocol of forgekit's own: any TVM tracker/server farm works.

:func:`connect` turns the usual failures into one-line :class:`RPCError` s (tracker unreachable, no server
registered with the key, remote CPU not the library's) before TVM would block or print a C++ backtrace:
a tracker queues a request for a key nobody serves forever, so the key is checked in the tracker's
summary first.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import RPCError, UsageError

#: seconds to wait for a tracker/server socket before calling it unreachable
CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class RpcConfig:
    """Where the remote device is: a tracker and a key, or one server (``host``) directly.

    ``wait`` is how long to wait for a server with ``key`` to be registered at the tracker (a board that
    is still starting), ``busy_wait`` how long to queue for one when all of them are in other sessions,
    in seconds.
    """

    tracker: str | None = None
    key: str | None = None
    host: str | None = None
    wait: float = 30.0
    busy_wait: float = 600.0

    @classmethod
    def from_options(cls, tracker: str | None = None, key: str | None = None, host: str | None = None,
                     wait: float = 30.0) -> RpcConfig | None:
        """The config for CLI/library options, ``None`` when none was given; one-line errors for bad
        combinations and addresses."""
        if tracker is None and host is None:
            if key is not None:
                raise UsageError("--rpc-key needs --rpc-tracker HOST:PORT (the tracker that knows the key).")
            return None
        if tracker is not None and host is not None:
            raise UsageError("Give either --rpc-tracker HOST:PORT with --rpc-key, or --rpc-host HOST:PORT, not both.")
        if tracker is not None and not key:
            raise UsageError("--rpc-tracker needs --rpc-key KEY (the key the board's RPC server registered with).")
        config = cls(tracker, key, host, wait)
        parse_address(tracker or host or "", "--rpc-tracker" if tracker else "--rpc-host")
        return config

    def describe(self) -> str:
        """``key 'K' at tracker H:P`` or ``server H:P``, for messages and results."""
        return f"key '{self.key}' at tracker {self.tracker}" if self.tracker else f"server {self.host}"


def parse_address(text: str, option: str = "address") -> tuple[str, int]:
    """``HOST:PORT`` as ``(host, port)``, or a one-line :class:`UsageError`."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{option} '{text}' is not HOST:PORT (e.g. 127.0.0.1:9190).")
    return host.strip("[]"), int(port)


def _reachable(host: str, port: int, what: str, hint: str) -> None:
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise RPCError(f"Cannot reach the RPC {what} at {host}:{port} ({reason.lower()}): {hint}") from None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(("Traceback", "  File"))]
    return lines[-1] if lines else type(exc).__name__


def connect(config: RpcConfig) -> Any:
    """An open ``tvm.rpc.RPCSession`` to a device of ``config``, or a one-line :class:`RPCError`."""
    from tvm import rpc

    if config.host is not None:
        host, port = parse_address(config.host, "--rpc-host")
        _reachable(host, port, "server", "start one on the board with 'python3 -m tvm.exec.rpc_server "
                   f"--host 0.0.0.0 --port {port}' or fix --rpc-host.")
        try:
            return rpc.connect(host, port, config.key or "")
        except Exception as exc:  # TVM raises its own error types with a C++ backtrace
            raise RPCError(f"The RPC server at {host}:{port} refused the session: {first_line(exc)}") from None
    host, port = parse_address(config.tracker or "", "--rpc-tracker")
    _reachable(host, port, "tracker", f"start one with 'python -m tvm.exec.rpc_tracker --host 0.0.0.0 --port {port}' "
               "or fix --rpc-tracker.")
    try:
        tracker = rpc.connect_tracker(host, port)
    except Exception as exc:
        raise RPCError(f"{host}:{port} is not a TVM RPC tracker: {first_line(exc)}") from None
    _wait_for_key(tracker, config, host, port)
    return _request(tracker, config, host, port)


def _request(tracker: Any, config: RpcConfig, host: str, port: int) -> Any:
    """``tracker.request(key)`` with a deadline: the tracker queues the request until a server of the
    key is free, which never happens when the only board is stuck in another session."""
    outcome: dict[str, Any] = {}

    def ask() -> None:
        try:
            outcome["session"] = tracker.request(config.key, max_retry=1)
        except Exception as exc:  # noqa: BLE001 - reported below as one line
            outcome["error"] = first_line(exc)

    worker = threading.Thread(target=ask, daemon=True)
    worker.start()
    worker.join(config.busy_wait)
    if worker.is_alive():
        tracker.close()  # drops the queued request at the tracker and unblocks the thread
        raise RPCError(f"Every RPC server with key '{config.key}' at the tracker {host}:{port} stayed busy for "
                       f"{config.busy_wait:.0f} s: wait for the other sessions to end or add boards.")
    if "error" in outcome:
        raise RPCError(f"The tracker at {host}:{port} could not open a session with key '{config.key}': "
                       f"{outcome['error']}")
    return outcome["session"]


def registered_keys(tracker: Any) -> dict[str, int]:
    """Key -> number of servers registered at the tracker (``tracker.summary()``)."""
    counts: dict[str, int] = {}
    for item in tracker.summary().get("server_info", []):
        key = str(item.get("key", "")).split(":", 1)[-1]  # servers register as 'server:<key>'
        counts[key] = counts.get(key, 0) + 1
    return counts


def _wait_for_key(tracker: Any, config: RpcConfig, host: str, port: int) -> None:
    deadline = time.monotonic() + config.wait
    while True:
        keys = registered_keys(tracker)
        if keys.get(config.key or "", 0):
            return
        if time.monotonic() >= deadline:
            known = ", ".join(sorted(keys)) or "none"
            raise RPCError(f"No RPC server with key '{config.key}' registered at the tracker {host}:{port} within "
                           f"{config.wait:.0f} s (registered keys: {known}): start one on the board with "
                           f"'python3 -m tvm.exec.rpc_server --tracker {host}:{port} --key {config.key}'.")
        time.sleep(0.5)


def remote_arch(session: Any) -> str | None:
    """The remote CPU architecture (``aarch64``, ``x86_64``...) as its TVM's LLVM sees it; ``None`` when the
    server has no LLVM (a runtime-only build), in which case loading a foreign library fails instead."""
    try:
        triple = str(session.get_function("target.llvm_get_system_triple")())
    except Exception:
        return None
    arch = triple.split("-", 1)[0]
    return {"arm64": "aarch64", "amd64": "x86_64"}.get(arch, arch)


def check_arch(session: Any, arch: str, what: str, config: RpcConfig) -> str | None:
    """Raise a one-line :class:`RPCError` when the remote CPU is not ``arch``; returns the remote arch."""
    remote = remote_arch(session)
    if remote is not None and arch and remote != arch and not (arch == "arm" and remote.startswith(("arm", "thumb"))):
        raise RPCError(f"The RPC device ({config.describe()}) is {remote} but {what} is built for {arch}: use a "
                       f"server of that architecture or compile for a target of the {remote} CPU.")
    return remote


def load_library(session: Any, library: str | Path, config: RpcConfig, shared: str | Path | None = None) -> Any:
    """Upload a shared library to the remote device and load it there; returns the remote module.  ``shared``:
    the weights file of a portable artifact's levels, uploaded next to it under its own name (which carries
    its content's digest, so clients of a shared server never clash)."""
    name = f"forgekit-{uuid.uuid4().hex[:12]}.so"  # servers are shared: never collide with another client
    try:
        if shared is not None:
            session.upload(str(shared), target=Path(shared).name)
        session.upload(str(library), target=name)
        return session.load_module(name)
    except Exception as exc:
        raise RPCError(f"The RPC device ({config.describe()}) cannot load '{Path(library).name}': "
                       f"{first_line(exc)}") from None
