"""How nodes exchange memory-tier copies: one request per TCP connection, a length-prefixed JSON header and
a file's raw bytes; a received copy is committed (manifest, rename) once it matches the sender's checksum."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import socketserver
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from lightning_resume._storage.catalog import Status, verify
from lightning_resume._storage.commit import commit_file
from lightning_resume._storage.kinds import FILE
from lightning_resume._storage.manifest import Entry
from lightning_resume._storage.writer import Aside
from lightning_resume.io.memory.placement import copy_path, safe_part

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("!I")
_MAX_HEADER = 1 << 20


class WireError(OSError):
    """A peer refused a request, or the connection broke before the copy was complete."""


def send_header(out: socket.socket, header: dict[str, Any]) -> None:
    data = json.dumps(header).encode()
    out.sendall(_LENGTH.pack(len(data)) + data)


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    """Exactly ``size`` bytes from the socket itself: what follows stays there for :func:`receive_copy`."""
    data = bytearray(size)
    view, got = memoryview(data), 0
    while got < size:
        n = conn.recv_into(view[got:])
        if n == 0:
            raise WireError(f"connection closed after {got} of {size} bytes")
        got += n
    return bytes(data)


def read_header(conn: socket.socket) -> dict[str, Any]:
    (size,) = _LENGTH.unpack(_recv_exact(conn, _LENGTH.size))
    if size > _MAX_HEADER:
        raise WireError(f"header of {size} bytes refused")
    header = json.loads(_recv_exact(conn, size))
    if not isinstance(header, dict):
        raise WireError("header is not a JSON object")
    return header


def receive_copy(conn: socket.socket, target: Path, entry: Entry) -> Entry:
    """Write the ``entry.size`` bytes coming on ``conn`` as a committed copy at ``target``: each piece
    received into one reused buffer, hashed there and written on (the copies of a raw TCP copy, no more);
    a short or different stream raises and leaves ``target`` as it was."""
    target.parent.mkdir(parents=True, exist_ok=True)
    aside = Aside(target, direct=False)
    try:
        aside.receive(conn.recv_into, entry.size)
    except EOFError as e:
        raise WireError(f"connection closed before the copy of {target.name} was complete: {e}") from e
    try:
        return commit_file(aside, entry)[0]
    except OSError as e:
        raise WireError(str(e)) from e


@contextlib.contextmanager
def _replacing(target: Path) -> Iterator[None]:
    """Keep the version at ``target`` open while a new copy replaces it: its memory (the whole file, in
    tmpfs) is freed when this exits, after the reply, not inside the rename while the sender waits (freeing
    a tmpfs file takes about a third of the time writing it did)."""
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK)  # never waits (were it a FIFO)
    except OSError:  # none yet (or unreadable: then the rename frees it, as without this)
        fd = None
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)


def committed_copy(path: Path) -> Entry | None:
    """The entry of the committed copy at ``path`` (its manifest and size agree), or ``None``."""
    verdict = verify(path, FILE, checksums=False)
    return verdict.manifest if verdict.status is Status.VERIFIED else None


def send_file(out: socket.socket, source: BinaryIO, entry: Entry) -> None:
    """Send the first ``entry.size`` bytes of the open file ``source``."""
    sent = out.sendfile(source, 0, entry.size)
    if sent != entry.size:
        raise WireError(f"{source.name} ended after {sent} of {entry.size} bytes")


class _Handler(socketserver.BaseRequestHandler):
    server: TierServer
    request: socket.socket

    def handle(self) -> None:
        try:
            header = read_header(self.request)
            op = header.get("op")
            if header.get("token") != self.server.token:
                send_header(self.request, {"ok": False, "error": "wrong token"})
            elif op == "put":
                self._put(header)
            elif op == "get":
                self._get(header)
            else:
                send_header(self.request, {"ok": False, "error": f"unknown request {op!r}"})
        except (OSError, ValueError, KeyError) as e:
            log.debug("memory tier request from %s failed: %s", self.client_address, e)
            with contextlib.suppress(OSError):
                send_header(self.request, {"ok": False, "error": str(e)})
        finally:
            with self.server._served_lock:
                self.server.served += 1

    def _target(self, header: dict[str, Any]) -> Path:
        key, name, origin = str(header["key"]), str(header["name"]), int(header["origin"])
        if not (safe_part(key) and safe_part(name)) or origin < 0:
            raise ValueError(f"refused name {key!r}/{origin}/{name!r}")
        return copy_path(self.server.root, key, origin, name)

    def _put(self, header: dict[str, Any]) -> None:
        target, entry = self._target(header), Entry.from_json(header["entry"])
        with self.server.receiving, _replacing(target):
            receive_copy(self.request, target, entry)
            send_header(self.request, {"ok": True})

    def _get(self, header: dict[str, Any]) -> None:
        target = self._target(header)
        try:
            held = open(target, "rb")  # noqa: SIM115 (the version open now stays readable if a newer one commits)
        except FileNotFoundError:
            send_header(self.request, {"ok": False, "error": f"{target.name} is not held"})
            return
        with held:
            entry = committed_copy(target)
            if entry is None or entry.checksum != header.get("checksum"):
                send_header(self.request, {"ok": False, "error": f"{target.name} is not held"})
                return
            send_header(self.request, {"ok": True, "entry": entry.to_json()})
            send_file(self.request, held, entry)


class TierServer(socketserver.ThreadingTCPServer):
    """Serves one node's memory tier folder ``root`` on ``port`` (``0``: any), to holders of ``token``."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, root: Path, token: str, port: int = 0) -> None:
        self.root, self.token = root, token
        self.receiving = threading.Lock()  # one incoming copy at a time: memory stays bounded
        self._served_lock = threading.Lock()
        self.served = 0  #: requests handled (answered or refused) so far
        super().__init__(("0.0.0.0", port), _Handler)
        self._thread = threading.Thread(
            target=self.serve_forever, name="lightning-resume-memory-tier", daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def close(self) -> None:
        self.shutdown()
        self.server_close()


def put(
    address: tuple[str, int],
    token: str,
    key: str,
    origin: int,
    name: str,
    source: BinaryIO,
    entry: Entry,
    timeout: float,
) -> None:
    """Copy the committed file ``name`` (open as ``source``) to ``address``; ``OSError`` if not committed."""
    header = dict(op="put", token=token, key=key, origin=origin, name=name, entry=entry.to_json())
    with socket.create_connection(address, timeout=timeout) as conn:
        send_header(conn, header)
        send_file(conn, source, entry)
        reply = read_header(conn)
    if not reply.get("ok"):
        raise WireError(f"{address[0]}:{address[1]} refused the copy: {reply.get('error')}")


def get(
    address: tuple[str, int],
    token: str,
    key: str,
    origin: int,
    name: str,
    entry: Entry,
    target: Path,
    timeout: float,
) -> Entry:
    """Fetch node ``origin``'s copy of ``name`` from ``address`` into ``target``, committed and checked."""
    header = dict(op="get", token=token, key=key, origin=origin, name=name, checksum=entry.checksum)
    with socket.create_connection(address, timeout=timeout) as conn:
        send_header(conn, header)
        reply = read_header(conn)
        if not reply.get("ok"):
            raise WireError(f"{address[0]}:{address[1]}: {reply.get('error')}")
        return receive_copy(conn, target, entry)


def local_address(toward: str | None) -> str:
    """This node's address on the interface that reaches ``toward`` (the job's master), else loopback."""
    if not toward:
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((toward, 9))  # no packet is sent: this only picks the route
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def host_name() -> str:
    return os.uname().nodename
