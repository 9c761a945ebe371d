"""Copies between nodes over real TCP connections: committed only when every byte arrived and matches;
a connection cut mid-copy (the sender killed) leaves the previous copy, and nothing half-written."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from _polls import wait_for

from lightning_resume._storage.manifest import Entry, checksum_file
from lightning_resume.io.memory import wire
from lightning_resume.io.memory.placement import copy_path

KEY, TOKEN = "run-0123456789abcdef", "secret"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[wire.TierServer]:
    made = wire.TierServer(tmp_path / "peer", TOKEN)
    yield made
    made.close()


def saved(path: Path, data: bytes, step: int) -> Entry:
    path.write_bytes(data)
    size, checksum = checksum_file(path)
    return Entry(size=size, checksum=checksum, global_step=step, saved_at=float(step))


def address(server: wire.TierServer) -> tuple[str, int]:
    return ("127.0.0.1", server.port)


def test_a_copy_sent_to_a_peer_is_committed_there_and_fetched_back(
    tmp_path: Path, server: wire.TierServer
) -> None:
    source = tmp_path / "last.ckpt"
    entry = saved(source, os.urandom(3 << 20), step=6)
    with open(source, "rb") as opened:
        wire.put(address(server), TOKEN, KEY, 0, "last.ckpt", opened, entry, timeout=10)
    held = copy_path(server.root, KEY, 0, "last.ckpt")
    assert held.read_bytes() == source.read_bytes()
    assert wire.committed_copy(held) == entry

    fetched = tmp_path / "fetched" / "last.ckpt"
    assert wire.get(address(server), TOKEN, KEY, 0, "last.ckpt", entry, fetched, timeout=10) == entry
    assert fetched.read_bytes() == source.read_bytes() and wire.committed_copy(fetched) == entry


def test_a_copy_cut_off_mid_transfer_never_counts(tmp_path: Path, server: wire.TierServer) -> None:
    old, new = tmp_path / "old.ckpt", tmp_path / "new.ckpt"
    first = saved(old, os.urandom(1 << 20), step=2)
    with open(old, "rb") as opened:
        wire.put(address(server), TOKEN, KEY, 0, "last.ckpt", opened, first, timeout=10)
    second = saved(new, os.urandom(4 << 20), step=4)
    # The sender dies after half the bytes: its connection closes.
    with socket.create_connection(address(server)) as conn:
        wire.send_header(
            conn,
            {
                "op": "put",
                "token": TOKEN,
                "key": KEY,
                "origin": 0,
                "name": "last.ckpt",
                "entry": second.to_json(),
            },
        )
        conn.sendall(new.read_bytes()[: second.size // 2])
    held = copy_path(server.root, KEY, 0, "last.ckpt")
    # Until the server has seen the cut and removed what it had written.
    assert wait_for(lambda: server.served >= 2) and server.served == 2
    assert wire.committed_copy(held) == first
    assert held.read_bytes() == old.read_bytes()
    assert sorted(p.name for p in held.parent.iterdir()) == ["last.ckpt", "last.ckpt.manifest.json"]


def test_bytes_that_differ_from_the_senders_checksum_are_refused(
    tmp_path: Path, server: wire.TierServer
) -> None:
    source = tmp_path / "last.ckpt"
    entry = saved(source, os.urandom(1 << 16), step=2)
    lying = Entry(size=entry.size, checksum="0" * 16, global_step=2)
    with open(source, "rb") as opened, pytest.raises(OSError, match="refused the copy"):
        wire.put(address(server), TOKEN, KEY, 0, "last.ckpt", opened, lying, timeout=10)
    assert wire.committed_copy(copy_path(server.root, KEY, 0, "last.ckpt")) is None


def test_requests_without_the_jobs_token_or_with_unsafe_names_are_refused(
    tmp_path: Path, server: wire.TierServer
) -> None:
    source = tmp_path / "last.ckpt"
    entry = saved(source, b"x" * 100, step=1)
    with open(source, "rb") as opened, pytest.raises(OSError, match="wrong token"):
        wire.put(address(server), "guess", KEY, 0, "last.ckpt", opened, entry, timeout=10)
    with open(source, "rb") as opened, pytest.raises(OSError, match="refused"):
        wire.put(address(server), TOKEN, "..", 0, "last.ckpt", opened, entry, timeout=10)
    assert not (server.root).exists() or not any(server.root.rglob("last.ckpt"))


def test_fetching_a_save_the_peer_no_longer_holds_fails(tmp_path: Path, server: wire.TierServer) -> None:
    entry = Entry(size=10, checksum="ab" * 8, global_step=3)
    with pytest.raises(OSError, match="not held"):
        wire.get(address(server), TOKEN, KEY, 0, "last.ckpt", entry, tmp_path / "x" / "last.ckpt", timeout=10)


def deleted_files_open_under(folder: Path) -> list[str]:
    """What this process holds open under ``folder`` that is no longer there (a replaced version)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith(str(folder)) and link.endswith(" (deleted)"):
            found.append(link)
    return found


def test_the_version_a_copy_replaces_is_let_go_once_the_sender_has_its_answer(
    tmp_path: Path, server: wire.TierServer
) -> None:
    old, new = tmp_path / "old.ckpt", tmp_path / "new.ckpt"
    first, second = saved(old, os.urandom(1 << 20), step=2), saved(new, os.urandom(2 << 20), step=4)
    for source, entry in ((old, first), (new, second)):
        with open(source, "rb") as opened:
            wire.put(address(server), TOKEN, KEY, 0, "last.ckpt", opened, entry, timeout=10)
    assert wait_for(lambda: server.served >= 2)  # the server lets the old version go after its answer
    held = copy_path(server.root, KEY, 0, "last.ckpt")
    assert wire.committed_copy(held) == second and held.read_bytes() == new.read_bytes()
    assert deleted_files_open_under(server.root) == []  # its memory is freed, not kept by the server
    assert sorted(p.name for p in held.parent.iterdir()) == ["last.ckpt", "last.ckpt.manifest.json"]


def test_a_copy_damaged_in_the_peers_memory_is_refused_by_the_fetch_and_leaves_nothing(
    tmp_path: Path, server: wire.TierServer
) -> None:
    # The restore loads a fetched copy without hashing it again: the fetch itself must refuse bad bytes.
    source = tmp_path / "last.ckpt"
    entry = saved(source, os.urandom(2 << 20), step=5)
    with open(source, "rb") as opened:
        wire.put(address(server), TOKEN, KEY, 0, "last.ckpt", opened, entry, timeout=10)
    held = copy_path(server.root, KEY, 0, "last.ckpt")
    with open(held, "r+b") as damaged:  # a flipped byte, same size: its manifest still matches
        damaged.seek(entry.size // 2)
        byte = damaged.read(1)
        damaged.seek(entry.size // 2)
        damaged.write(bytes([byte[0] ^ 0xFF]))
    fetched = tmp_path / "fetched" / "last.ckpt"
    with pytest.raises(wire.WireError, match="expected"):
        wire.get(address(server), TOKEN, KEY, 0, "last.ckpt", entry, fetched, timeout=10)
    assert not fetched.parent.exists() or sorted(fetched.parent.iterdir()) == []
