"""Is this address a Ray cluster the driver can join? Asked before ``ray.init``, which otherwise retries for
minutes (an address that accepts TCP but is not Ray) or fails after a stream of warnings (Ray's client port
without ``ray://``, a cluster that wants a token the driver lacks).

One gRPC call to the GCS's ``NodeInfoGcsService/GetClusterId`` (the call ``ray.init`` makes first) tells them
apart: a GCS answers it; a GCS with token authentication refuses it as UNAUTHENTICATED; Ray's client server
(``ray://``) does not know it (UNIMPLEMENTED) but knows ``RayletDriver/ClusterInfo``; anything else is not Ray,
and the first bytes it sends (or its answer to an HTTP request) name what it is.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from turngym.run.backends.ray_faults import RayPoolError

PROBE_S = 3.0  # each gRPC call of the probe; the whole check stays under 10 s
GCS_CALL = "/ray.rpc.NodeInfoGcsService/GetClusterId"
CLIENT_CALL = "/ray.rpc.RayletDriver/ClusterInfo"
TOKEN_SETTING = "RAY_AUTH_MODE=token"


def split_address(address: str) -> tuple[str, int, bool]:
    """``(host, port, is_client)`` of ``HOST:PORT`` or ``ray://HOST:PORT``; one line when it is neither."""
    scheme, sep, rest = address.partition("://")
    hostport = (rest if sep else address).rstrip("/")
    host, colon, port = hostport.rpartition(":")
    if (sep and scheme != "ray") or not colon or not host or not port.isdigit():
        raise RayPoolError(f"--ray {address}: give 'auto' or HOST:PORT (a Ray head's GCS address) or ray://HOST:PORT")
    return host.strip("[]"), int(port), bool(sep)


def check_address(address: str, timeout_s: float = 5.0) -> None:
    """Raise :class:`RayPoolError` (one line naming ``address`` and what answered) unless ``address`` is a Ray
    cluster this driver can join: a GCS for ``HOST:PORT``, a client server for ``ray://HOST:PORT``."""
    host, port, client = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        raise RayPoolError(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}") from None
    gcs = _status(host, port, GCS_CALL)
    if client:
        answer = _status(host, port, CLIENT_CALL)
        if answer == "UNAUTHENTICATED":
            raise _token_error(address)
        if answer not in ("UNIMPLEMENTED", "UNAVAILABLE", "DEADLINE_EXCEEDED", "ERROR"):
            return
        if gcs in ("OK", "UNAUTHENTICATED"):
            raise RayPoolError(f"--ray {address}: that port is a Ray cluster's GCS, not its client server; give "
                               f"{host}:{port} (no ray://) to join it as a driver")
        raise RayPoolError(f"--ray {address} is not a Ray client server: {_what_answers(host, port)}")
    if gcs == "OK":
        return
    if gcs == "UNAUTHENTICATED":
        raise _token_error(address)
    if gcs == "UNIMPLEMENTED" and _status(host, port, CLIENT_CALL) != "UNIMPLEMENTED":
        raise RayPoolError(f"--ray {address} is Ray's client port, not the GCS: give ray://{host}:{port} to join "
                           f"through the client, or the head's GCS port (6379 by default)")
    raise RayPoolError(f"{address} is not a Ray cluster's GCS: {_what_answers(host, port)}")


def _token_error(address: str) -> RayPoolError:
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        return RayPoolError(f"the Ray cluster at {address} refused this driver's token: set the cluster's token in "
                            f"RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token")
    return RayPoolError(f"the Ray cluster at {address} requires token authentication: set {TOKEN_SETTING} (the "
                        f"token comes from RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)")


def _status(host: str, port: int, method: str) -> str:
    """The gRPC status name of an empty ``method`` request (an empty protobuf is a valid one), or ERROR."""
    import grpc

    metadata: list[tuple[str, str]] = []
    token = _token()
    if token:
        metadata.append(("authorization", f"Bearer {token}"))
    channel = grpc.insecure_channel(f"{host}:{port}")
    try:
        channel.unary_unary(method)(b"", timeout=PROBE_S, metadata=metadata or None)
        return "OK"
    except grpc.RpcError as exc:
        code: Any = exc.code() if hasattr(exc, "code") else None
        return code.name if code is not None else "ERROR"
    finally:
        channel.close()


def _token() -> str | None:
    """The token a driver with ``RAY_AUTH_MODE=token`` would send (Ray's order: variable, file named, default file)."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        return None
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


def _what_answers(host: str, port: int) -> str:
    """What a non-Ray server on ``host:port`` says first: its banner, else its answer to an HTTP request."""
    try:
        with socket.create_connection((host, port), timeout=2.0) as s:
            s.settimeout(1.0)
            try:
                first = s.recv(200)
            except TimeoutError:
                first = b""
            if not first:
                s.settimeout(2.0)
                s.sendall(f"HEAD / HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
                try:
                    first = s.recv(200)
                except TimeoutError:
                    first = b""
    except OSError as exc:
        return f"the connection failed ({exc.strerror or exc})"
    line = first.split(b"\n", 1)[0].strip().decode("latin-1")
    if not line:
        return "it accepts connections but answers neither gRPC nor HTTP"
    return f"it answered {line[:80]!r}"


def gcs_answers(address: str, timeout_s: float = 2.0) -> bool:
    """Does the GCS at ``HOST:PORT`` still accept connections? (Cheap: one TCP connect, no gRPC.)"""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False
