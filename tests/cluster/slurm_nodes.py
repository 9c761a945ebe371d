"""A real SLURM partition over the nodes of a :class:`~.cluster.Cluster`: one ``slurmd`` per node.

Each node of the namespace cluster has its own network, hostname and PID namespace, so a ``slurmd``
started inside it (``node.popen``) is, to SLURM, a compute node of its own: ``NodeName`` is the node's
hostname, ``NodeAddr`` its bridge address, and the processes of its jobs live (and die) in that node.
``slurmctld`` runs on this machine, in the root namespace, on an address this module gives the
cluster's bridge (``<subnet>.254``; the bridge has none otherwise), which every node reaches on
``eth0``; the client tools (``sbatch``, ``scontrol``, ``squeue``) run here too.

This instance is separate from the single-node cluster of ``tests/slurm/cluster.sh`` and never touches
it: its own ``slurm.conf`` (in ``<workdir>/slurm``, passed as ``SLURM_CONF``; ``/etc/slurm`` is left
alone), its own ``ClusterName``, ports (:data:`CTLD_PORT`, :data:`SLURMD_PORT`), state, logs, and its
own ``munged`` with its own key and socket (``AuthInfo=socket=...``). No accounting: job states come
from ``scontrol show job`` (``MinJobAge`` keeps finished jobs there for 10 minutes). Each ``slurmd``
spools in its node's own ``/tmp``. Every daemon runs in the foreground as a child of this process,
dies with it (parent-death signal), and is stopped by :meth:`SlurmNodes.stop` (the context manager's
exit, also on a failed test): jobs cancelled, ``slurmd``\\s, ``slurmctld`` and ``munged`` stopped, the
bridge's address removed. Every wait is bounded; a failure message carries the daemons' logs.

:func:`unavailable` says why no such partition can run here (``None`` when it can): the namespace
cluster's own reasons, SLURM or munge missing (installed with ``apt-get`` when possible, as
``cluster.sh`` does), or a one-node partition that does not come up.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from .cluster import _DIE_WITH_PARENT, Cluster, ClusterError, Node

#: Distinct from ``tests/slurm/cluster.sh``'s 6817 (slurmctld), 6818 (slurmd) and 6819 (slurmdbd).
CTLD_PORT = 6837
SLURMD_PORT = 6838
CLUSTER_NAME = "lrnodes"
PARTITION = "nodes"
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
BINARIES = (
    "slurmctld",
    "slurmd",
    "sbatch",
    "srun",
    "scontrol",
    "squeue",
    "scancel",
    "munged",
    "munge",
    "unmunge",
)
#: The last host number of the subnet: slurmctld's address on the bridge.
CONTROLLER_HOST = 254
#: How long slurmctld waits for a silent slurmd before it sets its node DOWN (pinged every third of it).
SLURMD_TIMEOUT = 10
#: Jobs that ended stay in ``scontrol show job`` this long.
MIN_JOB_AGE = 600
#: Ended for good: a job in one of these states does not run again by itself.
FINAL_STATES = frozenset(
    {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "TIMEOUT"}
)
USABLE = frozenset({"IDLE", "MIXED", "ALLOCATED", "COMPLETING"})
_LOG_TAIL = 40


class SlurmError(RuntimeError):
    """A daemon did not start or stop, a client tool failed, or a wait ran out."""


def _tail(path: Path, lines: int = _LOG_TAIL) -> str:
    if not path.exists():
        return f"----- {path}: (none) -----"
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return f"----- {path} (last {len(text)} lines) -----\n" + "\n".join(text)


class SlurmNodes:
    """SLURM over ``cluster``'s live nodes (one partition, :data:`PARTITION`, of all of them); use as a
    context manager, or call :meth:`start` and :meth:`stop`.

    ``nodes`` (default: every live node) are the compute nodes. :meth:`run` runs a client tool here,
    with :attr:`env`; :meth:`sbatch`, :meth:`job`, :meth:`wait_job`, :meth:`node_states` and
    :meth:`wait_nodes` wrap the usual ones; :meth:`logs` is every daemon's log, for failure messages.
    """

    def __init__(
        self,
        cluster: Cluster,
        *,
        nodes: Sequence[Node] | None = None,
        state: Path | None = None,
        ctld_port: int = CTLD_PORT,
        slurmd_port: int = SLURMD_PORT,
        slurmd_timeout: int = SLURMD_TIMEOUT,
        start_timeout: float = 60,
    ) -> None:
        self.cluster = cluster
        self.nodes = list(nodes if nodes is not None else cluster.alive)
        if not self.nodes:
            raise SlurmError("no live node to run slurmd on")
        self.state = Path(state) if state is not None else cluster.workdir / "slurm"
        self.conf = self.state / "slurm.conf"
        self.log_dir = self.state / "log"
        self.munge_socket = self.state / "munge" / "socket"
        if len(os.fsencode(self.munge_socket)) > 100:  # sun_path holds 108 bytes
            raise SlurmError(f"{self.munge_socket}: too long a path for a unix socket; use a shorter workdir")
        self.ctld_port, self.slurmd_port = ctld_port, slurmd_port
        self.slurmd_timeout, self.start_timeout = slurmd_timeout, start_timeout
        self.controller = f"{cluster.subnet}.{CONTROLLER_HOST}"
        self.host = socket.gethostname().split(".")[0]  # slurmctld insists on this machine's short name
        self._munged: subprocess.Popen[bytes] | None = None
        self._slurmctld: subprocess.Popen[bytes] | None = None
        self._slurmd: dict[str, subprocess.Popen[bytes]] = {}
        self._address_added = False
        self._started = self._stopped = False

    # -- life --------------------------------------------------------------------------------------------

    def __enter__(self) -> SlurmNodes:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def env(self) -> dict[str, str]:
        """What the client tools (and the jobs they submit, ``sbatch`` exporting it) need on top of an
        environment: this instance's ``SLURM_CONF``."""
        return {"SLURM_CONF": str(self.conf)}

    def start(self) -> None:
        """Start munged, slurmctld and one slurmd per node; return once every node is idle. On a failure,
        whatever was started is stopped again."""
        if self._started:
            raise SlurmError("already started")
        self._started = True
        try:
            for folder in (self.state, self.log_dir, self.state / "ctld", self.munge_socket.parent):
                folder.mkdir(parents=True, exist_ok=True)
            self._add_address()
            self._start_munged()
            self._write_conf()
            self._start_slurmctld()
            for node in self.nodes:
                self.start_slurmd(node)
            self.wait_nodes([node.hostname for node in self.nodes], USABLE, self.start_timeout, "idle")
        except BaseException:
            with contextlib.suppress(SlurmError, ClusterError, OSError, subprocess.SubprocessError):
                self.stop()
            raise

    def _add_address(self) -> None:
        taken = subprocess.run(
            ["ip", "-o", "addr", "show", "to", self.controller], capture_output=True, text=True, timeout=30
        ).stdout.strip()
        if taken:
            raise SlurmError(f"{self.controller} is already an address of this machine: {taken}")
        self._ip("addr", "add", f"{self.controller}/24", "dev", self.cluster.bridge)
        self._address_added = True

    @staticmethod
    def _ip(*args: str) -> None:
        proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise SlurmError(f"ip {' '.join(args)}: {proc.stderr.strip()}")

    def _daemon(self, name: str, command: Sequence[str]) -> subprocess.Popen[bytes]:
        """Start a daemon here, in the foreground, as a child that dies with this process."""
        with open(self.log_dir / f"{name}.out", "ab") as out:
            return subprocess.Popen(
                [*_DIE_WITH_PARENT, *command],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                start_new_session=True,
            )

    def _start_munged(self) -> None:
        key = self.munge_socket.parent / "munge.key"
        if not key.exists():
            with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400), "wb") as f:
                f.write(os.urandom(1024))
        folder = self.munge_socket.parent
        # --force: this folder is the test's, not munge's (root owns it; munged runs as root here).
        self._munged = self._daemon(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={folder / 'munged.pid'}",
                f"--log-file={self.log_dir / 'munged.log'}",
                f"--seed-file={folder / 'munged.seed'}",
            ],
        )

        def answers() -> bool:
            encode = subprocess.run(
                ["munge", "-n", "-S", str(self.munge_socket)], capture_output=True, timeout=10
            )
            if encode.returncode != 0:
                return False
            decode = subprocess.run(
                ["unmunge", "-S", str(self.munge_socket)],
                input=encode.stdout,
                capture_output=True,
                timeout=10,
            )
            return decode.returncode == 0

        self._wait(answers, 20, "munged to answer", [self._munged], ["munged.out", "munged.log"])

    def _node_line(self, node: Node) -> str:
        # slurmd -C: the hardware every slurmd here sees (all nodes share this machine's CPUs and memory);
        # a node configured with more than it reports would be drained.
        probe = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30)
        found = re.search(r"^NodeName=\S+ (.*)$", probe.stdout, flags=re.M)
        if probe.returncode != 0 or not found:
            raise SlurmError(f"slurmd -C failed ({probe.returncode}): {probe.stdout}{probe.stderr}")
        return f"NodeName={node.hostname} NodeAddr={node.address} {found.group(1)} State=UNKNOWN"

    def _write_conf(self) -> None:
        names = ",".join(node.hostname for node in self.nodes)
        text = f"""\
# Generated by tests/cluster/slurm_nodes.py: one slurmd per namespace node. Not tests/slurm/cluster.sh's.
ClusterName={CLUSTER_NAME}
SlurmctldHost={self.host}({self.controller})
SlurmUser=root
SlurmdUser=root
SlurmctldPort={self.ctld_port}
SlurmdPort={self.slurmd_port}
AuthType=auth/munge
CredType=cred/munge
# Our own munged; a requeued job is held until cred_expire+1 s after it ended (5: the minimum).
AuthInfo=socket={self.munge_socket},cred_expire=5
StateSaveLocation={self.state / "ctld"}
# In each node's own /tmp (node-local).
SlurmdSpoolDir=/tmp/slurmd
SlurmctldPidFile={self.state / "slurmctld.pid"}
SlurmdPidFile={self.state / "slurmd-%n.pid"}
SlurmctldLogFile={self.log_dir / "slurmctld.log"}
SlurmdLogFile={self.log_dir / "slurmd-%n.log"}
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
MpiDefault=none
SwitchType=switch/none
# No cgroups for jobs (slurmd still loads its cgroup plugin: see start_slurmd).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1
JobRequeue=1
KillWait=5
MinJobAge={MIN_JOB_AGE}
InactiveLimit=0
ReturnToService=1
SlurmdTimeout={self.slurmd_timeout}
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
"""
        text += "".join(self._node_line(node) + "\n" for node in self.nodes)
        text += f"PartitionName={PARTITION} Nodes={names} Default=YES MaxTime=INFINITE State=UP\n"
        self.conf.write_text(text)

    def _start_slurmctld(self) -> None:
        self._slurmctld = self._daemon("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])

        def up() -> bool:
            return "is UP" in self.run("scontrol", "ping", check=False, timeout=10)

        self._wait(up, 30, "slurmctld to answer", [self._slurmctld], ["slurmctld.out", "slurmctld.log"])

    def start_slurmd(self, node: Node) -> None:
        """Start ``slurmd -D -N <hostname>`` inside ``node``, in the foreground (``node.popen``)."""
        if node.hostname in self._slurmd and self._slurmd[node.hostname].poll() is None:
            raise SlurmError(f"slurmd already runs on {node.hostname}")
        # The spool folder in the node's own /tmp; and slurmd initialises its cgroup plugin even with
        # proctrack/linuxproc and task/none, but a node's /sys (its network namespace's sysfs) has no
        # cgroup mounts: the machine's are mounted again there, as they are here.
        setup = node.run(["sh", "-ec", f"mkdir -p /tmp/slurmd\n{_cgroup_mounts()}"], timeout=30)
        if setup.returncode != 0:
            raise SlurmError(f"could not prepare {node.hostname} for slurmd: {setup.stdout}{setup.stderr}")
        self._slurmd[node.hostname] = node.popen(
            ["slurmd", "-D", "-N", node.hostname, "-f", str(self.conf)],
            env={**os.environ, **self.env},
            cwd="/",
            log=self.log_dir / f"slurmd-{node.hostname}.out",
        )

    def stop(self) -> None:
        """Cancel every job, stop every daemon and remove the bridge's address; Ctrl-C is held off
        until done. Idempotent; raises :class:`SlurmError` if something would not stop."""
        if self._stopped or not self._started:
            self._stopped = True
            return
        self._stopped = True
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        errors: list[str] = []
        try:
            if self._slurmctld is not None and self._slurmctld.poll() is None:
                try:
                    self._cancel_all(timeout=20)
                except (SlurmError, subprocess.SubprocessError) as error:
                    errors.append(f"cancelling jobs: {error}")
            for name, process in self._slurmd.items():
                if not _stop(process, 20):
                    errors.append(f"slurmd of {name} did not stop")
            # What jobs left on the nodes that are still up (slurmstepd, tasks): a node's own processes
            # end with it, but the nodes may outlive this partition.
            for node in self.nodes:
                if node.alive:
                    try:
                        node.stop_processes()
                    except ClusterError as error:
                        errors.append(str(error))
            for name, daemon in (("slurmctld", self._slurmctld), ("munged", self._munged)):
                if daemon is not None and not _stop(daemon, 20):
                    errors.append(f"{name} did not stop")
            if self._address_added:
                self._address_added = False
                try:
                    self._ip("addr", "del", f"{self.controller}/24", "dev", self.cluster.bridge)
                except SlurmError as error:
                    if self.cluster.bridge in _links():  # gone with the cluster: so is its address
                        errors.append(str(error))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        if errors:
            raise SlurmError("SLURM cleanup incomplete: " + "; ".join(errors))

    def _cancel_all(self, timeout: float) -> None:
        jobs = self.run("squeue", "-h", "-o", "%i", check=False, timeout=10).split()
        if not jobs:
            return
        self.run("scancel", *jobs, check=False, timeout=10)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.run("squeue", "-h", "-o", "%i", check=False, timeout=10).split():
                return
            time.sleep(0.25)

    # -- client tools ------------------------------------------------------------------------------------

    def run(
        self,
        *cmd: str | os.PathLike[str],
        check: bool = True,
        timeout: float = 30,
        env: dict[str, str] | None = None,
    ) -> str:
        """Run a client tool here with :attr:`env` (on top of ``env``, default this process's); stdout."""
        proc = subprocess.run(
            [str(c) for c in cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**(env if env is not None else os.environ), **self.env},
            stdin=subprocess.DEVNULL,
        )
        if check and proc.returncode != 0:
            raise SlurmError(f"{shlex.join(map(str, cmd))} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout

    def sbatch(self, *args: str | os.PathLike[str], env: dict[str, str] | None = None) -> str:
        """``sbatch --parsable ARGS`` with ``env`` (exported to the job); the job id."""
        job_id = self.run("sbatch", "--parsable", *args, env=env).strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch printed {job_id!r}")
        return job_id

    def job(self, job_id: str) -> dict[str, str] | None:
        """``scontrol show job -o`` as a dict; ``None`` for a job slurmctld does not know."""
        out = self.run("scontrol", "show", "job", "-o", job_id, check=False, timeout=10)
        if not out.strip():
            return None
        return dict(re.findall(r"(?:^|\s)([^\s=]+)=(\S*)", out.strip().splitlines()[0]))

    def node_states(self) -> dict[str, str]:
        """Each node's state as ``scontrol show nodes`` says it (``IDLE``, ``DOWN+NOT_RESPONDING``...)."""
        out = self.run("scontrol", "show", "nodes", "-o", check=False, timeout=10)
        found = {}
        for line in out.splitlines():
            fields = dict(re.findall(r"(?:^|\s)([^\s=]+)=(\S*)", line))
            if "NodeName" in fields:
                found[fields["NodeName"]] = fields.get("State", "")
        return found

    def wait_nodes(
        self, names: Iterable[str], states: Iterable[str], timeout: float, what: str
    ) -> dict[str, str]:
        """Wait until each of ``names`` is in a state whose base (before ``+``) is in ``states``."""
        names, wanted = list(names), set(states)
        deadline = time.monotonic() + timeout
        while True:
            last = self.node_states()
            if all(last.get(name, "").split("+")[0] in wanted for name in names):
                return last
            dead = [p for p in self._daemons(names) if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"{_describe(dead)} exited" if dead else f"timed out after {timeout:.0f} s"
                raise SlurmError(f"{why} waiting for nodes {names} {what}; states: {last}\n{self.logs()}")
            time.sleep(0.2)

    def wait_job(
        self, job_id: str, done: Callable[[dict[str, str]], bool], timeout: float, what: str, *logs: Path
    ) -> dict[str, str]:
        """Poll ``scontrol show job`` until ``done(record)``; fail early if the job ended otherwise
        (a final state ``done`` does not accept). ``logs``: job output to show on a failure."""
        last: dict[str, str] | None = None
        deadline = time.monotonic() + timeout
        while True:
            last = self.job(job_id)
            if last is not None and done(last):
                return last
            ended = last is not None and last.get("JobState") in FINAL_STATES
            if ended or time.monotonic() > deadline:
                why = (
                    f"ended {last.get('JobState') if last else None}"
                    if ended
                    else f"timed out ({timeout:.0f} s)"
                )
                raise SlurmError(
                    f"job {job_id}: {why} waiting for {what}; last record: {last}\n" + self.logs(*logs)
                )
            time.sleep(0.25)

    # -- diagnostics -------------------------------------------------------------------------------------

    def logs(self, *extra: Path) -> str:
        """The end of every daemon's log here (and of ``extra`` files, e.g. a job's output)."""
        paths = sorted(self.log_dir.glob("*")) if self.log_dir.exists() else []
        return "\n".join(_tail(path) for path in [*extra, *paths])

    def _daemons(self, names: Iterable[str] = ()) -> list[subprocess.Popen[bytes]]:
        """munged, slurmctld and the slurmds of those of ``names`` whose node is up."""
        up = {node.hostname for node in self.nodes if node.alive}
        slurmds = [self._slurmd[name] for name in names if name in self._slurmd and name in up]
        return [p for p in (self._munged, self._slurmctld, *slurmds) if p is not None]

    def _wait(
        self,
        done: Callable[[], object],
        timeout: float,
        what: str,
        daemons: Sequence[subprocess.Popen[bytes]],
        logs: Sequence[str] = (),
    ) -> None:
        """Poll ``done`` until true; fail at once if one of ``daemons`` exits, or after ``timeout``."""
        deadline = time.monotonic() + timeout
        while not done():
            dead = [p for p in daemons if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"{_describe(dead)} exited" if dead else f"timed out after {timeout:.0f} s"
                shown = [self.log_dir / name for name in logs] if logs else []
                raise SlurmError(
                    f"{why} waiting for {what}\n" + (self.logs(*shown) if shown else self.logs())
                )
            time.sleep(0.2)


def _describe(processes: Sequence[subprocess.Popen[bytes]]) -> str:
    def name(process: subprocess.Popen[bytes]) -> str:
        args = process.args if isinstance(process.args, list) else [process.args]
        words = [str(a) for a in args]
        program = next((w for w in words if w in ("munged", "slurmctld", "slurmd")), words[-1])
        return f"{program} (exit {process.returncode})"

    return ", ".join(map(name, processes))


def _stop(process: subprocess.Popen[bytes], timeout: float) -> bool:
    """SIGTERM the process's session (a daemon, or the ``nsenter`` and the daemon it waits for), then
    SIGKILL; whether it ended."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if process.poll() is not None:
            return True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=timeout)
    return process.poll() is not None


@functools.cache
def _cgroup_mounts() -> str:
    """Shell commands that mount, in a node, the cgroup file systems this machine has under
    ``/sys/fs/cgroup`` (v1 hierarchies are shared: mounting one again with its controllers attaches the
    same hierarchy), once per node: nothing if the node has some already."""
    root = "/sys/fs/cgroup"
    lines = [f"if ! grep -q ' {root}[ /]' /proc/self/mountinfo; then"]
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        target = fields[4]
        if not (target == root or target.startswith(root + "/")):
            continue
        fstype, source, options = fields[fields.index("-") + 1 :][:3]
        if fstype not in ("tmpfs", "cgroup", "cgroup2"):
            continue
        options = ",".join(o for o in options.split(",") if o not in ("rw", "ro")) or "defaults"
        lines.append(f"  mkdir -p {shlex.quote(target)}")
        lines.append(
            f"  mount -t {fstype} -o {shlex.quote(options)} {shlex.quote(source)} {shlex.quote(target)}"
        )
    lines += ["  :", "fi"]
    return "\n".join(lines)


def _links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=30).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]


def _missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None]


def install() -> str | None:
    """Install SLURM and munge with ``apt-get`` when binaries are missing (root only); why not, or
    ``None`` once they are all there."""
    if not _missing_binaries():
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"needs {', '.join(_missing_binaries())} (Debian: apt-get install {' '.join(PACKAGES)})"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command, timeout in (
        (["apt-get", "update", "-q"], 300),
        (["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES], 600),
    ):
        try:
            proc = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            return f"{' '.join(command)}: timed out after {timeout} s"
        if proc.returncode != 0:
            return f"{' '.join(command)} failed: {proc.stderr.strip()[-2000:]}"
    missing = _missing_binaries()
    return f"still missing after apt-get install: {', '.join(missing)}" if missing else None


@functools.cache
def unavailable(workdir: str) -> str | None:
    """Why no SLURM partition of namespace nodes can run here (``None``: one can). Installs SLURM when
    missing and possible, then starts one slurmd in a one-node cluster in ``workdir`` for real, runs a
    job step there, and stops it all."""
    from .cluster import unavailable as no_cluster

    reason = no_cluster(workdir)
    if reason:
        return f"no namespace cluster: {reason}"
    reason = install()
    if reason:
        return reason
    try:
        with Cluster(1, workdir=Path(workdir)) as probe, SlurmNodes(probe, start_timeout=30) as slurm:
            out = slurm.run("srun", "-N", "1", "hostname", timeout=60, check=False)
            if out.strip() != probe.nodes[0].hostname:
                return f"a job step on node0 printed {out!r}\n{slurm.logs()}"
    except (SlurmError, ClusterError, OSError, subprocess.SubprocessError) as error:
        return f"SLURM does not run one slurmd per namespace node here: {error}"
    return None


def job_script(path: Path, lines: Sequence[str]) -> Path:
    """Write an executable batch script of ``lines`` (bash) to ``path``."""
    path.write_text("#!/bin/bash\n" + "".join(f"{line}\n" for line in lines))
    path.chmod(0o755)
    return path


def quote(parts: Sequence[str | os.PathLike[str]]) -> str:
    return " ".join(shlex.quote(str(part)) for part in parts)


def output(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def main(argv: Sequence[str] | None = None) -> int:
    """``cd tests && python -m cluster.slurm_nodes [N] [WORKDIR]`` (as root): bring up N nodes (default
    2) with SLURM in WORKDIR, print ``sinfo`` and a job step on every node, stop it all (a check by hand)."""
    args = list(argv if argv is not None else sys.argv[1:])
    count = int(args[0]) if args else 2
    workdir = Path(args[1]) if len(args) > 1 else Path.cwd() / "slurm-nodes-check"
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with Cluster(count, workdir=workdir) as cluster, SlurmNodes(cluster) as slurm:
        print(f"up in {time.monotonic() - started:.1f} s")
        print(slurm.run("sinfo", "-N"))
        print(slurm.run("srun", "-N", str(count), "hostname", timeout=60))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
