"""A multi-node cluster on one machine, made of Linux namespaces, for the ``multinode`` tests.

Each node is

- a network namespace (``ip netns``) whose only link, ``eth0``, has the address ``10.77.0.<k>/24`` and is
  one end of a veth pair whose other end is a port of the cluster's bridge in the root namespace. The
  bridge has no address: traffic between nodes stays on it, inside the namespaces;
- a *holder* process: PID 1 of a PID namespace of its own, in a mount and a UTS namespace of its own,
  where ``/tmp`` and ``/dev/shm`` are tmpfs mounts of this node alone (its node-local storage), the
  cluster's ``hosts`` file is bound over ``/etc/hosts`` (every node's hostname resolves to its address)
  and the hostname is the node's name. The shared folders (the cluster's ``workdir`` and ``shared``) are
  bound back at their own paths, so all nodes see them even under ``/tmp``; the rest of the machine's
  filesystem (the repository, the virtualenv) is seen as it is. The holder only reaps orphans.

``node.popen``/``node.run`` start a command inside the node with ``nsenter`` (all four namespaces: the
process belongs to the node's PID namespace). ``node.kill()`` is a node loss: SIGKILL to the holder makes
the kernel kill every process of the node's PID namespace, the node's mount namespace (with its tmpfs
``/tmp`` and ``/dev/shm``) goes with the last of them, then its network namespace and veth are deleted.
``cluster.add_node()`` brings up a fresh node with the next name and address.

Cleanup: every name starts with ``lrc<pid>`` (the pid of the process that made the cluster). ``close()``
(the context manager's exit, also on a failed test or Ctrl-C) removes a cluster's nodes, links and
bridge; at the start, :func:`remove_leftovers` removes what a cluster whose maker is gone (a crashed or
killed earlier run) left. The holders die with their maker anyway (parent-death signal), and with them
every process of their nodes.

Needs root, ``ip`` (iproute2), ``unshare``, ``nsenter`` and ``setpriv`` (util-linux). :func:`unavailable`
says why a cluster cannot be made here (``None`` when it can).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

#: Every name (network namespace, link) a cluster makes starts with this and its maker's pid.
PREFIX = "lrc"
SUBNET = "10.77.0"
#: The node's link name inside its network namespace (``GLOO_SOCKET_IFNAME``).
IFNAME = "eth0"
TOOLS = ("ip", "unshare", "nsenter", "setpriv")
#: Started by this process: killed when the thread that started them exits (the maker killed).
_DIE_WITH_PARENT = ["setpriv", "--pdeathsig", "KILL", "--"]
_LOCALHOST = "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"
_OWNED = re.compile(rf"^{PREFIX}(\d+)(?:-|br$|h\d+$|n\d+$)")

# PID 1 of a node: mounts the node-local storage, binds the shared folders back and /etc/hosts, sets
# the hostname, says "ready", then reaps orphans until it is killed. argv: name, hosts file, tmpfs
# options, shared folders.
_HOLDER = r"""
import ctypes, os, signal, socket, sys

name, hosts, options, *shared = sys.argv[1:]
libc = ctypes.CDLL(None, use_errno=True)
MS_BIND, MS_REC = 4096, 16384

def mount(source, target, fstype, flags, data):
    if libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                  data.encode() if data else None) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"mount {source} on {target}: {os.strerror(error)}")

# The shared folders, opened before /tmp is covered: bound back through their descriptors.
folders = [(path, os.open(path, os.O_RDONLY | os.O_DIRECTORY)) for path in shared]
for target in ("/tmp", "/dev/shm"):
    mount(f"{name}-{target.rsplit('/', 1)[1]}", target, "tmpfs", 0, options)
for path, fd in folders:
    os.makedirs(path, exist_ok=True)
    mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, None)
    os.close(fd)
mount(hosts, "/etc/hosts", None, MS_BIND, None)
socket.sethostname(name)
print("ready", flush=True)
os.close(1)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
while True:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    signal.sigwait({signal.SIGCHLD})
"""


class ClusterError(RuntimeError):
    """A node could not be made, entered or removed."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise ClusterError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ns(pid: int, kind: str) -> str | None:
    """The namespace ``kind`` of process ``pid`` (``pid:[4026532...]``), ``None`` once it is gone."""
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def pids_in(kind: str, namespace: str) -> list[int]:
    """Every process whose namespace ``kind`` is ``namespace``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _ns(int(entry), kind) == namespace:
            found.append(int(entry))
    return found


def _wait_until(done: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.02)


def _netns_names() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()]


def _link_names() -> list[str]:
    return [line.split(":")[1].strip().split("@")[0] for line in _ip("-o", "link").stdout.splitlines()]


def remove(owner: int | None) -> list[str]:
    """Remove the network namespaces (and every process in them) and links of clusters made by ``owner``
    (``None``: by processes that are gone). Returns what it removed."""
    removed: list[str] = []

    def mine(name: str) -> bool:
        match = _OWNED.match(name)
        if not match:
            return False
        pid = int(match.group(1))
        return pid == owner if owner is not None else not _alive(pid)

    for netns in filter(mine, _netns_names()):
        for pid in map(int, _ip("netns", "pids", netns, check=False).stdout.split()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _ip("netns", "delete", netns, check=False)
        removed.append(netns)
    # The host ends of the veth pairs (deleting one end deletes both), then the bridges.
    links = list(filter(mine, _link_names()))
    for link in sorted(links, key=lambda name: name.endswith("br")):
        _ip("link", "delete", link, check=False)
        removed.append(link)
    return removed


def remove_leftovers() -> list[str]:
    """Remove what clusters of processes that are gone left behind (a crashed or killed test run)."""
    return remove(owner=None)


def leftovers(owner: int | None = None) -> list[str]:
    """The namespaces and links of clusters made by ``owner`` (default: every cluster) that exist now."""
    names = [*_netns_names(), *_link_names()]
    return [n for n in names if (m := _OWNED.match(n)) and (owner is None or int(m.group(1)) == owner)]


class Node:
    """One node of a :class:`Cluster`: its own network, hostname, ``/tmp``, ``/dev/shm`` and processes."""

    def __init__(self, cluster: Cluster, index: int) -> None:
        self.cluster, self.index = cluster, index
        self.hostname = f"node{index}"
        self.address = f"{cluster.subnet}.{index + 1}"
        self.netns = f"{cluster.tag}-{self.hostname}"
        self._host_link = f"{cluster.tag}h{index}"
        self._holder: subprocess.Popen[bytes] | None = None  # unshare, the holder's parent
        self.holder_pid = 0  # PID 1 of the node, as the machine sees it
        self.pid_namespace = self.mount_namespace = ""  # e.g. "pid:[4026532301]"
        self._processes: list[subprocess.Popen[bytes]] = []
        self.alive = False

    def __repr__(self) -> str:
        state = "up" if self.alive else "down"
        return f"Node({self.hostname}, {self.address}, {state})"

    # -- life --------------------------------------------------------------------------------------------

    def _start(self) -> None:
        cluster, inside = self.cluster, f"{self.cluster.tag}n{self.index}"
        _ip("netns", "add", self.netns)
        _ip("link", "add", inside, "type", "veth", "peer", "name", self._host_link)
        _ip("link", "set", self._host_link, "master", cluster.bridge, "up")
        _ip("link", "set", inside, "netns", self.netns)
        _ip("-n", self.netns, "link", "set", inside, "name", IFNAME)
        _ip("-n", self.netns, "addr", "add", f"{self.address}/24", "dev", IFNAME)
        _ip("-n", self.netns, "link", "set", IFNAME, "up")
        _ip("-n", self.netns, "link", "set", "lo", "up")
        options = "mode=1777" + (f",size={cluster.tmpfs_size}" if cluster.tmpfs_size else "")
        shared = [str(p) for p in cluster.shared]
        command = [*_DIE_WITH_PARENT, "ip", "netns", "exec", self.netns]
        command += ["unshare", "--mount", "--uts", "--pid", "--fork", "--mount-proc", "--kill-child"]
        command += ["--propagation", "private", sys.executable, "-I", "-c", _HOLDER]
        command += [self.hostname, str(cluster.hosts), options, *shared]
        with open(cluster.state / f"{self.hostname}.holder.log", "ab") as log:
            self._holder = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )
        assert self._holder.stdout is not None
        ready = select.select([self._holder.stdout], [], [], 60)[0]
        line = self._holder.stdout.readline() if ready else b""
        self._holder.stdout.close()
        if line.strip() != b"ready":
            log_text = (cluster.state / f"{self.hostname}.holder.log").read_text(errors="replace")
            raise ClusterError(f"{self.hostname} did not come up: {log_text.strip()}")
        self.holder_pid = self._child_of(self._holder.pid)
        self.pid_namespace = _ns(self.holder_pid, "pid") or ""
        self.mount_namespace = _ns(self.holder_pid, "mnt") or ""
        self.alive = True

    @staticmethod
    def _child_of(parent: int) -> int:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                    return int(entry)
        raise ClusterError(f"the holder started by process {parent} is gone")

    def kill(self, timeout: float = 30) -> None:
        """Lose this node: every process in it killed at once, its ``/tmp`` and ``/dev/shm`` gone (the
        mount namespace that held them no longer exists when this returns), its network removed."""
        if not self.alive:
            return
        self.alive = False
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.holder_pid, signal.SIGKILL)
        self._kill_entries()
        try:
            _wait_until(
                lambda: not pids_in("pid", self.pid_namespace), timeout, f"{self.hostname}'s processes"
            )
            _wait_until(
                lambda: not pids_in("mnt", self.mount_namespace), timeout, f"{self.hostname}'s mounts"
            )
        finally:
            for process in [self._holder, *self._processes]:
                if process is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        process.wait(timeout=timeout)
            _ip("netns", "delete", self.netns, check=False)
            _ip("link", "delete", self._host_link, check=False)
            self.cluster._write_hosts()

    # -- processes ---------------------------------------------------------------------------------------

    def command(
        self, cmd: Sequence[str | os.PathLike[str]], cwd: str | os.PathLike[str] | None = None
    ) -> list[str]:
        """``cmd`` wrapped to run inside this node (in ``cwd``, default: this process's)."""
        if not self.alive:
            raise ClusterError(f"{self.hostname} is down")
        wd = os.fspath(cwd) if cwd is not None else os.getcwd()
        enter = ["nsenter", f"--target={self.holder_pid}", "--net", "--mount", "--uts", "--pid", f"--wd={wd}"]
        return [*_DIE_WITH_PARENT, *enter, "--", *(str(part) for part in cmd)]

    def popen(
        self,
        cmd: Sequence[str | os.PathLike[str]],
        *,
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        log: Path | None = None,
        **options: Any,
    ) -> subprocess.Popen[bytes]:
        """Start ``cmd`` in this node, in a session of its own (``os.killpg(p.pid, sig)`` signals it and
        the ``nsenter`` that waits for it); with ``log``, its output is appended to that file."""
        out: IO[bytes] | None = open(log, "ab") if log is not None else None  # noqa: SIM115
        try:
            if out is not None:
                options.setdefault("stdout", out)
                options.setdefault("stderr", subprocess.STDOUT)
            options.setdefault("stdin", subprocess.DEVNULL)
            process = subprocess.Popen(self.command(cmd, cwd), env=env, start_new_session=True, **options)
        finally:
            if out is not None:
                out.close()
        self._processes.append(process)
        return process

    def run(
        self,
        cmd: Sequence[str | os.PathLike[str]],
        *,
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        timeout: float = 60,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` in this node to its end; output captured as text."""
        return subprocess.run(
            self.command(cmd, cwd),
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
            stdin=subprocess.DEVNULL,
        )

    def stopped(self) -> list[int]:
        """The processes of this node that are stopped (SIGSTOP: state ``T``)."""
        found = []
        for pid in self.pids():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T":
                    found.append(pid)
        return found

    def link_bytes(self) -> tuple[int, int]:
        """Bytes received and sent on this node's ``eth0`` so far."""
        stats = _ip("-n", self.netns, "-s", "-j", "link", "show", IFNAME).stdout
        found = json.loads(stats)[0]["stats64"]
        return int(found["rx"]["bytes"]), int(found["tx"]["bytes"])

    def pids(self) -> list[int]:
        """The processes running in this node (as the machine numbers them), the holder left out."""
        if not self.alive:
            return []
        return [pid for pid in pids_in("pid", self.pid_namespace) if pid != self.holder_pid]

    def signal(self, sig: int) -> list[int]:
        """Send ``sig`` to every process in this node (the holder left out); returns their pids."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pids

    def _kill_entries(self) -> None:
        """SIGKILL the ``nsenter`` processes still waiting on a command in this node: one whose command
        stopped (SIGSTOP) stops itself too, and would then never reap it (the node's PID namespace
        cannot end while a zombie of it waits for a parent outside)."""
        for process in self._processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)

    def stop_processes(self, timeout: float = 30) -> None:
        """SIGKILL every process in this node and wait for them to go; the node itself (its storage,
        network and name) stays up, as after a scheduler cancelled a job on it."""
        self.signal(signal.SIGKILL)
        self._kill_entries()
        _wait_until(lambda: not self.pids(), timeout, f"{self.hostname}'s processes")
        for process in self._processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=timeout)


class Cluster:
    """``n`` nodes on a private bridge; use as a context manager (or call :meth:`close`).

    ``workdir`` (a folder of this machine, also bound into every node: the shared filesystem) holds the
    cluster's ``hosts`` file and holder logs under ``.cluster/``; ``shared`` are more folders every node
    sees. ``tmpfs_size`` caps each node's ``/tmp`` and ``/dev/shm`` (``mount -o size=``).
    """

    def __init__(
        self,
        n: int = 2,
        *,
        workdir: Path,
        shared: Sequence[Path] = (),
        subnet: str = SUBNET,
        tmpfs_size: str | None = None,
    ) -> None:
        reason = unavailable_reason_static()
        if reason:
            raise ClusterError(reason)
        self.owner = os.getpid()
        self.tag = f"{PREFIX}{self.owner}"
        self.bridge = f"{self.tag}br"
        self.subnet, self.tmpfs_size = subnet, tmpfs_size
        self.workdir = Path(workdir).resolve()
        self.state = self.workdir / ".cluster"
        self.state.mkdir(parents=True, exist_ok=True)
        self.hosts = self.state / "hosts"
        self.hosts.write_text(_LOCALHOST)
        self.shared = [self.workdir, *(Path(p).resolve() for p in shared)]
        self.nodes: list[Node] = []
        self._closed = False
        remove_leftovers()
        if leftovers(self.owner):  # an earlier cluster of this process, not closed
            remove(self.owner)
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("link", "set", self.bridge, "up")
            for _ in range(n):
                self.add_node()
        except BaseException:
            with contextlib.suppress(ClusterError):
                self.close()
            raise

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def alive(self) -> list[Node]:
        return [node for node in self.nodes if node.alive]

    def add_node(self) -> Node:
        """A fresh node, with the next name (``node<k>``) and address."""
        if self._closed:
            raise ClusterError("the cluster is closed")
        node = Node(self, len(self.nodes))
        self.nodes.append(node)
        node._start()
        self._write_hosts()
        return node

    def _write_hosts(self) -> None:
        # In place: every node sees this file's inode, bound over its /etc/hosts.
        lines = "".join(f"{node.address} {node.hostname}\n" for node in self.alive)
        with open(self.hosts, "r+") as f:
            f.truncate(0)
            f.write(_LOCALHOST + lines)

    def close(self) -> None:
        """Kill every node and remove the bridge; Ctrl-C is held off until done. Idempotent."""
        if self._closed:
            return
        self._closed = True
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            errors = []
            for node in self.nodes:
                try:
                    node.kill()
                except ClusterError as error:
                    errors.append(str(error))
            remove(self.owner)  # whatever a node that failed half-way left
            left = leftovers(self.owner)
            if left or errors:
                raise ClusterError(f"cluster cleanup incomplete: {'; '.join(errors)} left: {left}")
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def unavailable_reason_static() -> str | None:
    """Why this machine cannot make a cluster, from what can be seen without trying (``None``: it may)."""
    if not sys.platform.startswith("linux"):
        return "needs Linux namespaces"
    if os.geteuid() != 0:
        return "needs root (network, mount, UTS and PID namespaces)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"needs {', '.join(missing)} (iproute2, util-linux)"
    return None


@functools.cache
def unavailable(workdir: str) -> str | None:
    """Why no cluster can be made here (``None``: one can): the static checks, then a one-node cluster
    made and removed for real in ``workdir``."""
    reason = unavailable_reason_static()
    if reason:
        return reason
    try:
        remove_leftovers()
        with Cluster(1, workdir=Path(workdir)) as probe:
            node = probe.nodes[0]
            seen = node.run(["hostname"], timeout=30)
            if seen.returncode != 0 or seen.stdout.strip() != node.hostname:
                return f"a node's command failed: {seen.stdout}{seen.stderr}"
    except (ClusterError, OSError, subprocess.SubprocessError) as error:
        return f"cannot make a namespace node here: {error}"
    return None
