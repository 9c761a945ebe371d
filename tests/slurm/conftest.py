"""Fixtures for tests against the real local SLURM cluster of ``tests/slurm/cluster.sh``.

``slurm_cluster`` (session) makes sure the cluster is up: under CI (``CI`` set) a cluster that is not up
is a failure, elsewhere it is started with ``cluster.sh start`` first. ``slurm`` (per test) is the same
helper, but it cancels the jobs its test submitted when the test ends, so that a failed test cannot hold
the node for the next one.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

CLUSTER_SH = Path(__file__).resolve().parent / "cluster.sh"
TESTS = CLUSTER_SH.parent.parent
#: States after which a job will not run again by itself.
FINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)

# Final states a requeueable job does not leave by itself.
FAILED_STATES = frozenset(
    {"BOOT_FAIL", "CANCELLED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "TIMEOUT"}
)


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _cluster_sh(command: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(CLUSTER_SH), command],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


class SlurmCluster:
    """Thin wrappers over the SLURM client tools, every wait bounded."""

    def __init__(self, env: dict[str, str]) -> None:
        self._env = env
        self.submitted: list[str] = []

    @property
    def env(self) -> dict[str, str]:
        """The environment to run SLURM client tools (or submitit) with: this one plus ``SLURM_CONF``.

        Jobs inherit it (``sbatch`` exports the environment), so ``tests/`` is on ``PYTHONPATH`` for
        ``python -m jobs.train_job``.
        """
        path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
        return {**os.environ, "PYTHONPATH": path, **self._env}

    def run(self, *cmd: str | os.PathLike[str], timeout: float = 30, check: bool = True) -> str:
        proc = subprocess.run(
            [str(c) for c in cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            stdin=subprocess.DEVNULL,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{shlex.join(map(str, cmd))} failed ({proc.returncode}): {proc.stderr.strip()}"
            )
        return proc.stdout

    def sbatch(self, *args: str | os.PathLike[str]) -> str:
        """Submit with ``sbatch --parsable ARGS`` and return the job id."""
        job_id = self.run("sbatch", "--parsable", *args).strip().split(";")[0]
        assert job_id.isdigit(), f"sbatch printed {job_id!r}"
        self.submitted.append(job_id)
        return job_id

    def job(self, job_id: str) -> dict[str, str] | None:
        """``scontrol show job -o`` as a dict; None once slurmctld has forgotten the job (MinJobAge)."""
        out = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        if not out.strip():
            return None
        return dict(re.findall(r"(?:^|\s)([^\s=]+)=(\S*)", out.strip().splitlines()[0]))

    def state(self, job_id: str) -> str | None:
        job = self.job(job_id)
        return job["JobState"] if job else self.sacct_state(job_id)

    def sacct_state(self, job_id: str) -> str | None:
        """The job's state in the accounting database (what submitit reads), None if not recorded yet."""
        out = self.run("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State", check=False)
        lines = [line.split()[0] for line in out.splitlines() if line.strip()]
        return lines[-1] if lines else None

    def wait_state(
        self, job_id: str, states: Iterable[str], timeout: float = 60, poll: float = 0.25
    ) -> dict[str, str]:
        """Poll ``scontrol show job`` until the job is in one of ``states``; return the job record."""
        wanted = set(states)
        deadline = time.monotonic() + timeout
        last: dict[str, str] | None = None
        while time.monotonic() < deadline:
            last = self.job(job_id)
            if last is not None and last["JobState"] in wanted:
                return last
            if last is not None and last["JobState"] in FINAL_STATES - wanted:
                break
            time.sleep(poll)
        raise AssertionError(f"job {job_id} not in {sorted(wanted)} after {timeout}s: {last}")

    def wait_sacct_state(self, job_id: str, state: str, timeout: float = 30, poll: float = 0.5) -> None:
        """Wait for ``state``; give up early once the job has sat in a failed state for 10 s."""
        deadline = time.monotonic() + timeout
        last, final_since = None, None
        while time.monotonic() < deadline:
            last = self.sacct_state(job_id)
            if last == state:
                return
            if last in FAILED_STATES and (self.job(job_id) or {}).get("JobState") in FAILED_STATES:
                final_since = final_since or time.monotonic()  # not pending a requeue either
                if time.monotonic() - final_since > 10:
                    break
            else:
                final_since = None
            time.sleep(poll)
        raise AssertionError(f"sacct: job {job_id} is {last}, expected {state} within {timeout}s")

    @staticmethod
    def wait_lines(
        path: Path, predicate: Callable[[list[str]], bool], timeout: float, poll: float = 0.2
    ) -> list[str]:
        """Poll the text file ``path`` until ``predicate(lines)`` holds and return its lines."""
        deadline = time.monotonic() + timeout
        lines: list[str] = []
        while time.monotonic() < deadline:
            lines = path.read_text().splitlines() if path.exists() else []
            if predicate(lines):
                return lines
            time.sleep(poll)
        raise AssertionError(f"{path}: condition not met within {timeout}s; lines so far: {lines}")

    def cpus(self) -> int:
        """CPUs of the (single) node."""
        out = self.run("sinfo", "-h", "-N", "-o", "%c")
        return int(out.split()[0])

    def cancel_submitted(self, timeout: float = 20) -> None:
        """Cancel whatever this helper submitted that is still queued or running, and wait for it to end."""
        live = [j for j in self.submitted if (self.job(j) or {}).get("JobState") not in FINAL_STATES | {None}]
        if not live:
            return
        self.run("scancel", *live, check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(
            (self.job(j) or {}).get("JobState") not in FINAL_STATES | {None} for j in live
        ):
            time.sleep(0.25)

    def drain(self, timeout: float = 60) -> None:
        """Cancel every job on the cluster and wait for the node to be idle.

        The cluster is this test run's own, so whatever is queued is a leftover of an earlier test
        (jobs submitted through submitit or Hydra are not in ``submitted``). A node still ending a job
        (``COMPLETING``) would keep the next ``--exclusive`` job pending on "Resources".
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            jobs = self.run("squeue", "-h", "-o", "%i", check=False).split()
            node = self.run("sinfo", "-h", "-N", "-o", "%t", check=False).split()
            if not jobs and node and all(state.rstrip("*") == "idle" for state in node):
                return
            if jobs:
                self.run("scancel", *jobs, check=False)
            time.sleep(0.25)
        raise AssertionError(f"the SLURM node is not idle after {timeout}s: jobs {jobs}, node {node}")


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    """The local SLURM cluster, up and idle (started here unless running under CI)."""
    status = _cluster_sh("status", timeout=60)
    if status.returncode != 0:
        if _in_ci():
            pytest.fail(
                "the SLURM test cluster is not up (CI is set, so it is not started here): "
                f"run `tests/slurm/cluster.sh start` before pytest.\n{status.stderr}",
                pytrace=False,
            )
        # Below pytest-timeout's 600 s, so that a slow install fails with the script's own message.
        start = _cluster_sh("start", timeout=540)
        if start.returncode != 0:
            pytest.fail(
                f"`tests/slurm/cluster.sh start` failed ({start.returncode}):\n{start.stdout}{start.stderr}",
                pytrace=False,
            )
    env_lines = _cluster_sh("env", timeout=10).stdout
    env = dict(re.findall(r"^export (\w+)=(.*)$", env_lines, flags=re.M))
    env = {k: shlex.split(v)[0] if v else "" for k, v in env.items()}
    return SlurmCluster(env)


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """Per-test helper: like ``slurm_cluster``, and the jobs it submitted are cancelled afterwards."""
    helper = SlurmCluster(slurm_cluster._env)
    helper.drain()
    yield helper
    helper.cancel_submitted()
