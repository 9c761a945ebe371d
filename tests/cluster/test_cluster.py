"""The namespace cluster itself: names, addresses, node-local storage, a shared folder, node loss, and
cleanup however its maker ends (a context exit, Ctrl-C, SIGKILL)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .cluster import Cluster, leftovers, pids_in, remove_leftovers
from .launch import wait_for

pytestmark = pytest.mark.multinode

PYTHON = sys.executable
TESTS = Path(__file__).resolve().parent.parent


def test_each_node_has_its_own_name_address_and_storage_and_all_share_the_workdir(
    cluster: Cluster, tmp_path: Path
) -> None:
    node0, node1 = cluster.nodes
    assert (node0.address, node1.address) == ("10.77.0.1", "10.77.0.2")
    for node in cluster.nodes:
        seen = node.run(["sh", "-c", "hostname; ip -o -4 addr show eth0"])
        assert seen.returncode == 0, seen.stderr
        assert seen.stdout.splitlines()[0] == node.hostname
        assert f"inet {node.address}/24" in seen.stdout
        marker = f"written by {node.hostname}"
        write = f"echo '{marker}' | tee /tmp/marker /dev/shm/marker {tmp_path}/{node.hostname}"
        assert node.run(["sh", "-c", write]).returncode == 0
    for node in cluster.nodes:  # node-local: each node reads its own marker, the machine neither
        local = node.run(["cat", "/tmp/marker", "/dev/shm/marker"]).stdout
        assert local == f"written by {node.hostname}\n" * 2
    assert not Path("/tmp/marker").exists() and not Path("/dev/shm/marker").exists()
    # Shared: every node and the machine see what each wrote in the workdir.
    for node in cluster.nodes:
        assert (
            node.run(["cat", str(tmp_path / "node0"), str(tmp_path / "node1")]).stdout.count("written") == 2
        )
    assert (tmp_path / "node1").read_text() == "written by node1\n"

    # node0 reaches node1 by its name, across the bridge.
    server = "import socket; s = socket.create_server(('', 5000)); c, a = s.accept(); print(a[0], c.recv(9))"
    listening = node1.popen([PYTHON, "-c", server], log=tmp_path / "server.log")
    client = (
        "import socket, time; time.sleep(1); socket.create_connection(('node1', 5000)).sendall(b'over eth0')"
    )
    sent = node0.run([PYTHON, "-c", client])
    assert sent.returncode == 0, sent.stderr
    assert listening.wait(timeout=30) == 0
    assert (tmp_path / "server.log").read_text().split() == ["10.77.0.1", "b'over", "eth0'"]
    # ... and nowhere else: a node has no route off the bridge.
    outside = node0.run(
        [PYTHON, "-c", "import socket; socket.create_connection(('10.0.2.2', 80), timeout=2)"]
    )
    assert outside.returncode != 0


def test_a_killed_node_loses_every_process_and_its_storage_and_a_fresh_node_replaces_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    node0, node1 = cluster.nodes
    # A process tree that escapes its session (a daemon) and a file in node memory.
    tree = "echo data > /dev/shm/ckpt; setsid sleep 1000 & sleep 1000 & wait"
    started = node1.popen(["sh", "-c", tree], log=tmp_path / "tree.log")
    wait_for(lambda: len(node1.pids()) >= 3, 30, "node1's processes")  # sh, 2 x sleep
    pids, holder, netns, mounts = node1.pids(), node1.holder_pid, node1.netns, node1.mount_namespace

    node1.kill()
    assert started.wait(timeout=30) == -signal.SIGKILL
    assert not any(Path(f"/proc/{pid}").exists() for pid in [*pids, holder])
    assert not pids_in("mnt", mounts)  # its mount namespace, with its /tmp and /dev/shm, is gone
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert netns not in names
    assert not node1.alive and cluster.alive == [node0]

    node2 = cluster.add_node()
    assert (node2.hostname, node2.address) == ("node2", "10.77.0.3")
    assert node2.run(["ls", "-A", "/dev/shm"]).stdout == ""
    hosts = node0.run(["cat", "/etc/hosts"]).stdout
    assert "10.77.0.3 node2" in hosts and "node1" not in hosts
    reach = "import socket; print(socket.gethostbyname('node2'))"
    assert node0.run([PYTHON, "-c", reach]).stdout.strip() == "10.77.0.3"


SERVE = (
    "import socket, sys; s = socket.create_server(('', 5000)); [s.accept() for _ in range(int(sys.argv[1]))]"
)
CALL = """
import socket, sys, time
for name in sys.argv[1:]:
    for _ in range(300):
        try:
            socket.create_connection((name, 5000), timeout=10).close()
            break
        except ConnectionRefusedError:  # not listening yet
            time.sleep(0.1)
    else:
        sys.exit(f"no answer from {name}")
"""


def test_three_nodes_reach_each_other_by_name(cluster_support: None, tmp_path: Path) -> None:
    with Cluster(3, workdir=tmp_path) as made:
        servers = [node.popen([PYTHON, "-c", SERVE, "2"]) for node in made.nodes]
        for node in made.nodes:
            others = [other.hostname for other in made.nodes if other is not node]
            called = node.run([PYTHON, "-c", CALL, *others])
            assert called.returncode == 0, called.stderr
        assert [server.wait(timeout=30) for server in servers] == [0, 0, 0]


MAKER = """
import signal, sys, time
from pathlib import Path
# Ctrl-C raises, even when the test runs in a background job (started with SIGINT ignored, inherited).
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, sys.argv[2])
from cluster.cluster import Cluster
with Cluster(2, workdir=Path(sys.argv[1])) as made:
    made.nodes[1].popen(["sleep", "1000"])
    time.sleep(0.5)
    print(made.nodes[0].holder_pid, made.nodes[1].holder_pid, *made.nodes[1].pids(), flush=True)
    time.sleep(120)
"""


@pytest.mark.parametrize("how", ["SIGINT", "SIGKILL"])
def test_nothing_is_left_after_the_maker_is_interrupted_or_killed(
    cluster_support: None, tmp_path: Path, how: str
) -> None:
    """Ctrl-C: the maker removes its cluster on the way out. SIGKILL: every process of its nodes dies
    with it (parent-death signal); the namespaces and links it left are removed by the next cluster."""
    maker = subprocess.Popen(
        [PYTHON, "-c", MAKER, str(tmp_path), str(TESTS)], stdout=subprocess.PIPE, text=True
    )
    assert maker.stdout is not None
    pids = [int(pid) for pid in maker.stdout.readline().split()]
    assert len(pids) >= 3 and leftovers(maker.pid)
    maker.send_signal(signal.Signals[how])
    # Its cleanup waits up to 30 s per node for the node's processes and mounts to go (once over 60 s in a
    # full `make test-multinode`): a bound above that, so that only a cleanup that never ends fails here.
    maker.wait(timeout=180)
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in pids), 30, "the nodes' processes")
    if how == "SIGINT":
        assert maker.returncode != 0 and not leftovers(maker.pid)
    else:
        assert leftovers(maker.pid)  # kernel objects outlive their maker ...
        removed = remove_leftovers()  # ... until the next cluster comes up
        assert f"lrc{maker.pid}br" in removed and not leftovers(maker.pid)
