"""The memory tier against the durable tier alone, on two real nodes (Linux namespaces on this machine).

For each checkpoint size (per node: rank 0 writes it, DDP style) and each setup, side by side in one run:

- **durable only**: ``DurableCheckpointIO()`` writing ``last.ckpt`` to the run dir, as today;
- **memory, 1 replica**: ``DurableCheckpointIO(memory=MemoryTier(replicas=1, durable_every=1))``.

The durable tier is this machine's disk throttled to ``--durable-mbps`` (default 200 MB/s, reads and
writes), a node's share of a shared filesystem: every process of the benchmark runs in a blkio cgroup
with ``blkio.throttle.{read,write}_bps_device`` set for the disk. Node memory is each node's own tmpfs
``/dev/shm`` (not throttled). Page caches are dropped before every restore.

Columns (seconds; the second of two saves, the first warms the buffers up):

- **floor**: copying the checkpoint's tensors into memory already allocated (the raw memory-copy floor);
- **stall**: how long ``save_checkpoint`` held the training thread, and its ratio to the floor;
- **replica**: from the save until the copy is committed in the peer node's memory (and, in a second
  table, the send alone, from the commit in this node's memory, against a raw TCP copy of the same bytes
  between the same two nodes: ``sendfile``, ``recv_into`` one buffer, ``write``, ``fsync``; and our
  ``put`` and ``get`` alone, in fresh processes, taken in turns with the raw copies, medians of 3);
- **durable**: from the save until it is committed on the durable tier;
- **restart**: restore after the processes restart on the same nodes (memory: each node's own tier);
- **node loss**: restore after the writer's node is lost and a fresh node joins (memory: the peer's replica;
  the slowest rank; the second table has the fetch alone against the raw copy from that peer);
- **durable restore**: restore on two fresh nodes (no memory copy anywhere: the durable tier);
- **MB read**: megabytes of the durable ``last.ckpt`` read by the restores after a restart and after a
  node loss (its pages in the page cache, ``fincore``: caches are dropped before, and writes bypass it);
- **exact**: every restored tensor equals the saved one.

Needs root (namespaces, cgroups, ``drop_caches``)::

    sudo python benchmarks/memory_tier.py [--sizes 256,1024] [--durable-mbps 200]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1] / "tests"))  # the namespace cluster of the multi-node tests

TIER = "/dev/shm/lightning-resume-bench"
PORT = 29600
CGROUP = Path("/sys/fs/cgroup/blkio")
PIECE_MB = 64  # the checkpoint is made of tensors of this size


# -- the worker: one process per node --------------------------------------------------------------


def _state(size_mb: int, step: int) -> dict[str, Any]:
    import torch

    pieces, elements = max(1, size_mb // PIECE_MB), (min(size_mb, PIECE_MB) << 20) // 4
    weights = {f"layer{i}": torch.arange(elements, dtype=torch.int32) * 7 + (i + step) for i in range(pieces)}
    return {"global_step": step, "epoch": 0, "state_dict": weights}


def _floor(state: dict[str, Any]) -> float:
    import torch

    tensors = list(state["state_dict"].values())
    targets = [torch.empty_like(t) for t in tensors]
    times = []
    for _ in range(3):
        start = time.perf_counter()
        for target, tensor in zip(targets, tensors, strict=True):
            target.copy_(tensor)
        times.append(time.perf_counter() - start)
    return min(times)


def _strategy(nodes: int) -> Any:
    import torch
    from lightning.fabric.plugins.environments import LightningEnvironment
    from lightning.pytorch.strategies import DDPStrategy

    strategy = DDPStrategy(
        parallel_devices=[torch.device("cpu")],
        cluster_environment=LightningEnvironment(),
        process_group_backend="gloo",
    )
    strategy.num_nodes = nodes
    strategy.setup_distributed()
    return strategy


def worker(args: argparse.Namespace) -> None:
    import torch

    from lightning_resume import DurableCheckpointIO, MemoryTier
    from lightning_resume._collectives import gather_objects
    from lightning_resume.io.durable_checkpoint_io import memory_tier_of

    strategy = _strategy(args.nodes)
    memory = MemoryTier(TIER, replicas=1, durable_every=1) if args.mode == "memory" else None
    io = DurableCheckpointIO(memory=memory)
    durable_dir = Path(args.root) / "checkpoints"
    path = durable_dir / "last.ckpt"
    route = memory_tier_of(io)
    if route is not None:
        route.attach(strategy, durable_dir)
    found: dict[str, Any] = {"node": strategy.node_rank}
    if args.phase == "save":
        if strategy.global_rank == 0:
            first = _state(args.size_mb, 1)
            io.save_checkpoint(first, path)
            io.wait_until_durable()
            del first
            state = _state(args.size_mb, 2)
            found["floor"] = _floor(state)
            start = time.monotonic()
            io.save_checkpoint(state, path)
            found["stall"] = time.monotonic() - start
            tier = route.memory if route is not None else None
            while True:
                now = time.monotonic() - start
                if tier is not None and tier.timings.step == 2:
                    if "replica" not in found and tier.timings.replicas:
                        found["replica"] = now
                        found["replica_send"] = next(iter(tier.timings.replicas.values()))
                    if "durable" not in found and tier.timings.durable is not None:
                        found["durable"] = now
                    if "replica" in found and "durable" in found:
                        break
                elif tier is None and not io.busy:
                    found["durable"] = now
                    break
                time.sleep(0.002)
            found["file_bytes"] = path.stat().st_size
        strategy.barrier()  # the peer serves until the replica is in
    else:
        start = time.monotonic()
        loaded = io.load_checkpoint(path)
        found["seconds"] = time.monotonic() - start
        expected = _state(args.size_mb, 2)["state_dict"]
        found["exact"] = loaded["global_step"] == 2 and all(
            torch.equal(loaded["state_dict"][k], v) for k, v in expected.items()
        )
        restore = io.last_restore
        found["fetch"] = route.memory.timings.fetch if route is not None else None
        found["tier"] = restore.tier if restore is not None else None
        found["from"] = restore.host if restore is not None else None
    everyone = gather_objects(strategy, found)
    io.teardown()
    if route is not None:
        route.close()
    if strategy.global_rank == 0:
        print("RESULT " + json.dumps(everyone), flush=True)


# -- the floor: a raw TCP copy of the same bytes between the same two nodes ------------------------------

FLOOR_PORT = 29650
_RECEIVE = """
import os, socket, sys
size, out = int(sys.argv[1]), sys.argv[2]
with socket.create_server(("0.0.0.0", FLOOR_PORT)) as server:
    print("READY", flush=True)
    conn, _ = server.accept()
    with conn:
        piece, got = memoryview(bytearray(4 << 20)), 0
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        while got < size:
            n = conn.recv_into(piece[: size - got])
            os.write(fd, piece[:n])
            got += n
        os.fsync(fd)
        os.close(fd)
        conn.sendall(b"k")
os.unlink(out)
""".replace("FLOOR_PORT", str(FLOOR_PORT))
_SEND = """
import glob, socket, sys, time
(path,) = glob.glob(sys.argv[2] + "/*/node-0/last.ckpt")
with open(path, "rb") as source, socket.create_connection((sys.argv[1], FLOOR_PORT)) as conn:
    start = time.monotonic()
    conn.sendfile(source)
    assert conn.recv(1) == b"k"
    print("FLOOR", time.monotonic() - start, flush=True)
""".replace("FLOOR_PORT", str(FLOOR_PORT))


def raw_copy(sender: Any, receiver: Any, size: int, log: Path) -> float:
    """Seconds of a raw TCP copy of ``sender``'s memory copy into ``receiver``'s ``/dev/shm``: ``sendfile``
    into the socket, ``recv_into`` one reused buffer, ``write``, ``fsync`` (what the wire does, minus the
    checksum and the commit)."""
    listening = receiver.popen(
        [sys.executable, "-c", _RECEIVE, str(size), "/dev/shm/floor.bin"],
        log=log.with_name(f"{log.name}-recv"),
    )
    deadline = time.monotonic() + 60
    while "READY" not in log.with_name(f"{log.name}-recv").read_text():
        if time.monotonic() > deadline or listening.poll() is not None:
            raise RuntimeError(f"the floor receiver did not start: {log.with_name(f'{log.name}-recv')}")
        time.sleep(0.05)
    sending = sender.popen([sys.executable, "-c", _SEND, receiver.hostname, TIER], log=log)
    if sending.wait(timeout=600) != 0 or listening.wait(timeout=60) != 0:
        raise RuntimeError(f"the raw copy failed: {log.read_text()[-2000:]}")
    return float(next(x for x in log.read_text().splitlines() if x.startswith("FLOOR")).split()[1])


# -- the wire alone: our put and get between the same two nodes, each beside a raw copy ------------------

WIRE_PORT = 29660
REPEATS = 3  # the copies alone, and the raw copies, are each measured this many times (medians)
_SERVE = """
import sys, time
from pathlib import Path
from lightning_resume.io.memory import wire
server = wire.TierServer(Path(sys.argv[1]), "bench", WIRE_PORT)
print("READY", flush=True)
time.sleep(3600)
""".replace("WIRE_PORT", str(WIRE_PORT))
_ENTRY = """
import glob, json, sys
from pathlib import Path
from lightning_resume.io.memory import wire
(path,) = glob.glob(sys.argv[1] + "/*/node-0/last.ckpt")
entry = wire.committed_copy(Path(path))
print("ENTRY", json.dumps({"key": Path(path).parents[1].name, "entry": entry.to_json()}))
"""
_PUT = """
import glob, sys, time
from pathlib import Path
from lightning_resume.io.memory import wire
(path,) = glob.glob(sys.argv[2] + "/*/node-0/last.ckpt")
entry = wire.committed_copy(Path(path))
with open(path, "rb") as source:
    start = time.monotonic()
    wire.put((sys.argv[1], WIRE_PORT), "bench", "bench-wire", 0, "last.ckpt", source, entry, 600)
    print("WIRE", time.monotonic() - start, flush=True)
""".replace("WIRE_PORT", str(WIRE_PORT))
_GET = """
import json, shutil, sys, time
from pathlib import Path
from lightning_resume._storage.manifest import Entry
from lightning_resume.io.memory import wire
found = json.loads(sys.argv[2])
target = Path("/dev/shm/bench-wire/last.ckpt")
target.parent.mkdir(parents=True, exist_ok=True)
entry = Entry.from_json(found["entry"])
start = time.monotonic()
wire.get((sys.argv[1], WIRE_PORT), "bench", found["key"], 0, "last.ckpt", entry, target, 600)
print("WIRE", time.monotonic() - start, flush=True)
shutil.rmtree(target.parent)
""".replace("WIRE_PORT", str(WIRE_PORT))


def _output(process: Any, log: Path, tag: str) -> str:
    """What ``process`` printed after ``tag`` (into ``log``), once it ended well."""
    if process.wait(timeout=600) != 0:
        raise RuntimeError(f"{tag} failed: {log.read_text()[-2000:]}")
    return next(x for x in log.read_text().splitlines() if x.startswith(tag)).split(maxsplit=1)[1]


def wire_beside_floor(sender: Any, receiver: Any, size: int, log: Path) -> tuple[list[float], list[float]]:
    """Seconds of ``REPEATS`` copies of ``sender``'s memory copy into ``receiver``'s ``/dev/shm`` by our wire
    alone (fresh processes: nothing else of the job runs) and of as many raw copies, taken in turns:
    ``put`` when ``sender`` is node 0 (the replica), else ``get`` by ``receiver`` (the restore's fetch)."""
    fetch = sender.hostname != "node0"
    server_node, client = (sender, receiver) if fetch else (receiver, sender)
    serving = server_node.popen([sys.executable, "-c", _SERVE, TIER], log=log.with_name(f"{log.name}-server"))
    try:
        deadline = time.monotonic() + 60
        while "READY" not in log.with_name(f"{log.name}-server").read_text():
            if time.monotonic() > deadline or serving.poll() is not None:
                raise RuntimeError(f"the wire server did not start: {log.with_name(f'{log.name}-server')}")
            time.sleep(0.05)
        if fetch:
            found = log.with_name(f"{log.name}-entry")
            entry = _output(sender.popen([sys.executable, "-c", _ENTRY, TIER], log=found), found, "ENTRY")
            command = [sys.executable, "-c", _GET, sender.hostname, entry]
        else:
            command = [sys.executable, "-c", _PUT, receiver.hostname, TIER]
        ours, floors = [], []
        for turn in range(REPEATS):
            for which in ("floor", "wire") if turn % 2 == 0 else ("wire", "floor"):
                name = log.with_name(f"{log.name}-{which}-{turn}")
                if which == "floor":
                    floors.append(raw_copy(sender, receiver, size, name))
                else:
                    ours.append(float(_output(client.popen(command, log=name), name, "WIRE")))
    finally:
        os.killpg(serving.pid, signal.SIGKILL)  # the server and the nsenter that waits for it
        serving.wait(timeout=60)
    if not fetch:
        receiver.run(["rm", "-rf", f"{TIER}/bench-wire"])
    return ours, floors


# -- the driver -----------------------------------------------------------------------------------


@contextlib.contextmanager
def throttled(folder: Path, mbps: float) -> Iterator[None]:
    """This process and its children in a blkio cgroup limited to ``mbps`` on ``folder``'s disk."""
    device = os.stat(folder).st_dev
    group = CGROUP / f"lightning-resume-bench-{os.getpid()}"
    group.mkdir()
    try:
        rate = int(mbps * 1e6)
        for name in ("blkio.throttle.read_bps_device", "blkio.throttle.write_bps_device"):
            (group / name).write_text(f"{os.major(device)}:{os.minor(device)} {rate}\n")
        (group / "cgroup.procs").write_text(str(os.getpid()))
        yield
    finally:
        (CGROUP / "cgroup.procs").write_text(str(os.getpid()))
        with contextlib.suppress(OSError):
            group.rmdir()


def cached_mb(path: Path) -> float:
    """MB of ``path`` in the page cache: what was read of it since the caches were dropped (its writes
    bypass the cache, ``O_DIRECT``)."""
    found = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)], capture_output=True, text=True
    )
    return int(found.stdout.split()[0]) / 1e6 if found.returncode == 0 and found.stdout.strip() else 0.0


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def run_phase(
    nodes: Sequence[Any], phase: str, mode: str, size_mb: int, root: Path, log: Path
) -> list[dict[str, Any]]:
    from cluster.cluster import IFNAME

    command = [sys.executable, str(HERE), "--worker", phase, "--mode", mode, "--size-mb", str(size_mb)]
    command += ["--root", str(root), "--nodes", str(len(nodes))]
    processes = []
    for rank, node in enumerate(nodes):
        env = {
            **os.environ,
            "MASTER_ADDR": nodes[0].hostname,
            "MASTER_PORT": str(PORT),
            "NODE_RANK": str(rank),
            "LOCAL_RANK": "0",
            "WORLD_SIZE": str(len(nodes)),
            "GLOO_SOCKET_IFNAME": IFNAME,
            "PYTHONWARNINGS": "ignore",
        }
        processes.append(node.popen(command, env=env, log=log.with_name(f"{log.name}-{node.hostname}.log")))
    codes = [p.wait(timeout=900) for p in processes]
    text = log.with_name(f"{log.name}-{nodes[0].hostname}.log").read_text()
    results = [line for line in text.splitlines() if line.startswith("RESULT ")]
    if codes != [0] * len(nodes) or not results:
        raise RuntimeError(f"{phase} ({mode}, {size_mb} MB) failed: {codes}\n{text[-4000:]}")
    found: list[dict[str, Any]] = json.loads(results[-1][len("RESULT ") :])
    return found


def measure(mode: str, size_mb: int, workdir: Path) -> dict[str, Any]:
    from cluster.cluster import Cluster

    folder = Path(tempfile.mkdtemp(prefix=f"{mode}-{size_mb}-", dir=workdir))
    root, row = folder / "run", {"mode": mode, "size_mb": size_mb}
    with Cluster(2, workdir=folder) as cluster:
        node0, node1 = cluster.nodes
        saved = run_phase([node0, node1], "save", mode, size_mb, root, folder / "save")[0]
        row.update({k: saved.get(k) for k in ("floor", "stall", "replica", "replica_send", "durable")})
        if mode == "memory":  # the same bytes, the same two nodes, side by side
            row["send_wire"], row["send_floors"] = wire_beside_floor(
                node0, node1, saved["file_bytes"], folder / "send"
            )
        durable = root / "checkpoints" / "last.ckpt"
        drop_caches()
        restart = run_phase([node0, node1], "restore", mode, size_mb, root, folder / "restart")
        read = cached_mb(durable)
        node0.kill()  # the writer's node is lost, with its memory
        node2 = cluster.add_node()
        if mode == "memory":
            row["fetch_wire"], row["fetch_floors"] = wire_beside_floor(
                node1, node2, saved["file_bytes"], folder / "fetch"
            )
        drop_caches()
        lost = run_phase([node1, node2], "restore", mode, size_mb, root, folder / "lost")
        row["fetch"] = max((r["fetch"] for r in lost if r.get("fetch") is not None), default=None)
        read += cached_mb(durable)
        node1.kill()
        node2.kill()
        drop_caches()
        fresh = run_phase(
            [cluster.add_node(), cluster.add_node()], "restore", mode, size_mb, root, folder / "fresh"
        )
    row["restart"] = max(r["seconds"] for r in restart)
    row["node_loss"] = max(r["seconds"] for r in lost)
    row["durable_restore"] = max(r["seconds"] for r in fresh)
    row["read_mb"] = read
    row["ranks"] = {"restart": [r["seconds"] for r in restart], "lost": [r["seconds"] for r in lost]}
    row["tiers"] = f"{restart[0]['tier']}/{lost[1]['tier']}/{fresh[0]['tier']}"
    row["exact"] = all(r["exact"] for r in restart + lost + fresh)
    subprocess.run(["rm", "-rf", str(folder)], check=False)
    return row


def _cell(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_table(rows: list[dict[str, Any]], mbps: float) -> None:
    print(
        f"\nDurable tier throttled to {mbps:.0f} MB/s (blkio cgroup); node memory: tmpfs /dev/shm; 2 nodes."
    )
    header = (
        f"{'setup':<20}{'MB':>6}{'floor':>7}{'stall':>7}{'x floor':>8}{'replica':>9}{'durable':>9}"
        f"{'restart':>9}{'node loss':>10}{'durable restore':>16}{'MB read':>8}  "
        f"{'tiers (restart/loss/fresh)':<28}exact"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        name = "memory, 1 replica" if row["mode"] == "memory" else "durable only"
        print(
            f"{name:<20}{row['size_mb']:>6}{_cell(row['floor']):>7}{_cell(row['stall']):>7}"
            f"{_cell(row['stall'] / row['floor'], 1):>8}{_cell(row.get('replica')):>9}"
            f"{_cell(row['durable']):>9}"
            f"{_cell(row['restart']):>9}{_cell(row['node_loss']):>10}{_cell(row['durable_restore']):>16}"
            f"{row['read_mb']:>8.0f}  {row['tiers']:<28}{'yes' if row['exact'] else 'NO'}"
        )
    print("\nThe copies between nodes against a raw TCP copy of the same bytes between the same two nodes")
    print(
        "(sendfile into the socket, recv_into one buffer, write, fsync: the network's floor), the median of"
    )
    print(f"{REPEATS} raw copies taken in turns with {REPEATS} copies by our wire alone (put, get; fresh")
    print(
        "processes, nothing else of the job running). In the job, once each: the replica send of the second"
    )
    print(
        "save (its durable copy runs meanwhile: durable_every=1) and the fetch of the restore after the node"
    )
    print("loss.\n")
    print(
        "| MB | op | in the job s | alone s | raw copy s | x floor, in the job | x floor, alone | "
        "alone, each x its raw copy |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        if row["mode"] != "memory" or not row.get("send_floors"):
            continue
        for op, job in (("send", row.get("replica_send")), ("fetch", row.get("fetch"))):
            ours, floors = row[f"{op}_wire"], row[f"{op}_floors"]
            floor, alone = statistics.median(floors), statistics.median(ours)
            each = " ".join(f"{o / f:.2f}" for o, f in zip(ours, floors, strict=True))
            print(
                f"| {row['size_mb']} | {op} | {_cell(job)} | {_cell(alone)} | {_cell(floor)} | "
                f"{_cell(job / floor) if job else '-'} | {_cell(alone / floor)} | {each} |"
            )
    print()
    by = {(r["mode"], r["size_mb"]): r for r in rows}
    for size in sorted({r["size_mb"] for r in rows}):
        durable, memory = by.get(("durable", size)), by.get(("memory", size))
        if durable and memory:
            print(
                f"{size} MB: restore after a node loss "
                f"{durable['node_loss'] / memory['node_loss']:.1f}x faster "
                f"from a peer's memory; after a restart {durable['restart'] / memory['restart']:.1f}x; "
                f"stall {memory['stall'] / durable['stall']:.2f}x the durable-only stall"
            )
            if memory.get("fetch") and memory.get("fetch_floors"):
                floor = statistics.median(memory["fetch_floors"])
                at_floor = memory["node_loss"] - memory["fetch"] + floor
                print(
                    f"  at the floor (the fetch as fast as the raw copy, the rest as measured): "
                    f"{durable['node_loss'] / at_floor:.1f}x; the raw copy alone takes {floor:.2f} s: "
                    f"{durable['node_loss'] / floor:.1f}x if loading took no time"
                )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="256,1024", help="checkpoint sizes in MB, comma separated")
    parser.add_argument("--durable-mbps", type=float, default=200.0, help="the durable tier's rate (MB/s)")
    parser.add_argument("--workdir", default="/var/tmp", help="a folder on the disk to throttle")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="memory", help=argparse.SUPPRESS)
    parser.add_argument("--size-mb", type=int, default=256, help=argparse.SUPPRESS)
    parser.add_argument("--root", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--nodes", type=int, default=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.phase = args.worker
        worker(args)
        return
    from cluster.cluster import unavailable

    workdir = Path(tempfile.mkdtemp(prefix="lightning-resume-memory-tier-", dir=args.workdir))
    reason = unavailable(str(workdir))
    if reason or os.geteuid() != 0 or not CGROUP.is_dir():
        sys.exit(f"needs root, Linux namespaces and the blkio cgroup: {reason or 'not root or no blkio'}")
    rows = []
    with throttled(workdir, args.durable_mbps):
        for size in (int(s) for s in args.sizes.split(",")):
            for mode in ("durable", "memory"):
                started = time.monotonic()
                rows.append(measure(mode, size, workdir))
                print(f"  {mode} {size} MB measured in {time.monotonic() - started:.0f} s", flush=True)
    print_table(rows, args.durable_mbps)
    subprocess.run(["rm", "-rf", str(workdir)], check=False)


if __name__ == "__main__":
    main()
