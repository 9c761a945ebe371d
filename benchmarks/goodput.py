"""Goodput under preemption: plain Lightning against lightning_resume, side by side in one run.

A training job runs under a seeded preemption process and is relaunched after every exit, the way a
SLURM requeue relaunches it (same run dir key, the same ``SLURM_JOB_ID`` with ``SLURM_RESTART_COUNT``
counting the launches, ``--requeue-wait`` seconds later), until it finishes. A launch killed during
its imports leaves no attempt record; the next one sees the gap in the restart count, and ``"auto"``
counts it as an interruption.
Preemptions arrive as a Poisson process in wall-clock time (mean ``--mtbp`` seconds), each one of
three kinds (``--mix``). Every row of a rate faces the same process: the same seeded arrivals and
the same kind for its n-th preemption (the kinds are a seeded sequence drawn in blocks of ten that
hold the mix's shares, so that a row hit a few times meets every kind, a row with notices gets
notices). With ``--clock launch`` (the default) the n-th launch of a row is preempted the n-th gap
between arrivals after it starts; with ``--clock wall`` the arrivals are counted from the row's
first launch. Arrivals are memoryless, so the two are the same process (an arrival while no job
runs is dropped either way), but with ``wall`` two rows fall out of step at their first difference
and then meet unrelated arrivals: a row hit three times during its imports and its neighbour never
differ by more than their intervals do. With ``launch`` the rows differ only by what each attempt
keeps of the same lifetime.

- ``sigterm``: SIGTERM to the trainer, SIGKILL to its process group ``--grace`` seconds later
  (a scheduler's preemption with a grace window: SLURM's KillWait, Kubernetes' grace period);
- ``notice``: a warning ``--notice-lead`` seconds before the SIGTERM, then SIGKILL ``--notice-grace``
  seconds after it (a spot reclaim). lightning_resume rows with notices poll a ``FileNotice`` the
  preemption process writes (with the deadline), and writes again every 0.5 s until the SIGTERM, as
  a metadata endpoint keeps answering (a job still importing sees the notice once it polls); plain
  Lightning gets SIGUSR1 at the warning, what ``sbatch --signal=USR1@lead`` delivers to its SLURM
  auto-requeue handler;
- ``sigkill``: SIGKILL to the process group, no warning (node loss, OOM killer).

Arrivals while no job is running (between attempts) or while one is already being stopped are dropped
(they take no kind).

The job: a small MLP whose step is padded to ``--step-ms`` with a sleep (a GPU step, as the CPU sees
it), with ``--state-mb`` MB of extra state in a buffer (a checkpoint of that size: the saves are
real), trained for ``--steps`` optimizer steps on one epoch of a plain shuffled ``DataLoader``.
Rows:

- ``plain Lightning every N``: ``ModelCheckpoint(every_n_train_steps=N, save_last=True)`` and
  ``fit(ckpt_path="last")``, run with SLURM's variables set so that ``SLURMEnvironment`` and its
  auto-requeue handler are active (``scontrol`` is a stub that succeeds: the relaunch loop is the
  requeue). On SIGUSR1 that handler writes ``hpc_ckpt_N.ckpt``, which ``ckpt_path="last"`` never
  loads; on SIGTERM Lightning stops at the next step with no save. Its resume is not exact (a plain
  ``DataLoader`` is restarted from its first batch, no random state is restored).
- ``ours every N``: ``RunDir`` + ``RequeueCheckpoint(every_n_train_steps=N)`` + ``PreemptionHandler``
  (+ ``DurableCheckpointIO()``, asynchronous, unless ``--sync``); a sweep over ``--sweep`` values of N.
- ``ours auto``: ``RequeueCheckpoint(every_n_train_steps="auto", expected_interruption_every=MTBP)``
  (the user's rough idea of the preemption rate; ``--no-prior``: none, the history alone).
- ``ours auto + notices``: the same with ``PreemptionHandler(notices=Notices([FileNotice(...)], margin=1))``.

Columns: goodput (the steps' own time, ``--steps`` x the median step time of an uninterrupted run,
over the row's wall time from the first launch to the finish, requeue waits included); goodput at
the horizon (the time the first of the rate's rows trained its last step: the steps of each row's
final result trained by then, at the same step time, over the horizon; the rows are compared by it);
the preemptions that hit the row; steps lost per preemption (the steps trained and not part of the final
result, read from a per-step progress file, over the preemptions that hit a running job), per noticed
one, and per SIGKILL; the mean restart overhead (a relaunch to the end of its first step: imports,
the checkpoint load, the first step); the two costs the interval trades, the save stall and the lost
steps, in seconds (the lost steps at the median step time; the stall from ``attempts.json``, our rows
only: every save is recorded as it returns, a killed attempt misses only the save it was killed
in); the intervals ``auto`` chose, attempt by attempt; whether the final weights are bitwise equal
to the uninterrupted run's; for our rows, the goodput ``lightning-resume report`` computes from
``attempts.json`` (a check of the report).

Why the horizon: a row's goodput to its finish jumps by a whole restart (imports, load, first step:
several seconds) when its last few steps spill into one more attempt, so two rows a few steps apart
can differ by points. Up to a time every row reached (the rows of a rate stay in step: each attempt
lives the same time), each row counts what it kept by then, with no such jump. For the first row to
finish, the two differ only by the end of its process after the last step (the same for every row).

``--seed`` takes several seeds: every rate's rows run once per seed (each seed its own arrivals and
kinds), and the last tables give each row's mean goodput at the horizon over the seeds with its
standard error, and the differences the targets are about, taken seed by seed (the rows of a seed met
the same preemptions) with their mean, standard error and range: ``auto`` minus the best fixed N (the
one with the highest mean), ``auto`` minus each seed's own best (the maximum of a few noisy rows,
which favours the sweep), ours minus plain Lightning, and the steps lost per noticed preemption over
all seeds. A PNG plots the mean goodput against the mean time between preemptions, with the standard
errors (its path is printed).

Usage::

    python benchmarks/goodput.py --quick        # 300 steps, 6 rows, one rate: about 5 min quiet
                                                # (--quick's rate: half the uninterrupted run's wall time)
    python benchmarks/goodput.py --medium       # 2 rates x 5 rows, sized to --budget (30 min)
    python benchmarks/goodput.py --medium --seed 0 1 2 3 --budget 90 --plain-every 60
                                                # the same 4 times over, the means and their errors
    python benchmarks/goodput.py                # 4 rates x 9 rows of 2000 steps: about 2 hours, quiet machine

``--medium`` is sized to end within ``--budget`` minutes (default 30) on the machine it runs on, a
loaded 2-core one included. A probe run (60 steps) measures the restart cost ``c`` (launch to the
end of the first step, plus ``--requeue-wait``) and the step time; the two rates are ``2c`` and
``3c`` mean seconds between preemptions (the fastest a job that pays ``c`` at every restart still
finishes at); the steps are as many as the budget allows (all seeds together). On a 2-core
machine shared with other work it took 17 to 26 minutes (``c`` = 8 s, 1167 steps), and its rows
met 6 to 10 preemptions at ``2c``, 3 to 6 at ``3c``: enough for the notices row to show its gain,
not to rank intervals within a factor of three of the optimum. Rows facing the same preemptions
still differ by where each SIGKILL falls within their interval (up to a whole interval of steps
each); compare ``auto`` with the best fixed N over several seeds (``--seed 0 1 2 3``), not one run.
Rows: ours every 20, 60 and 180 steps, ``auto``, ``auto + notices`` (plain Lightning only with
``--plain-every N``); ``--notice-grace 0.1`` (rows without notices never save at a notice's SIGTERM,
where 0.5 s made it a coin toss against a 0.5 s save); saves synchronous (``--sync``) of 128 MB of
state, so that a save costs a measurable stall and the interval has an optimum to find (with the
background writes of ``DurableCheckpointIO`` a save stalls for milliseconds, and every interval short
enough is as good).

Targets (of the issue, not asserted): with notices, <= 1 step lost per noticed preemption on average;
``auto`` within 2 goodput points of the best fixed N at every rate; ours ahead of plain Lightning.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("sigterm", "notice", "sigkill")
#: --quick's mean time between preemptions, in uninterrupted runs' wall times.
QUICK_MTBP_SHARE = 0.5
#: --medium's fixed intervals, and its rates in restart costs (launch to first step, plus the wait).
MEDIUM_SWEEP = [20, 60, 180]
MEDIUM_RATES = (2.0, 3.0)
#: A preemption costs more than the restart (the steps it loses, the save at the signal, the grace):
#: this many restarts, for --medium's sizing.
MEDIUM_COST_PER_RESTART = 1.3
PROBE_STEPS = 60
REPO = Path(__file__).resolve().parent.parent
START = time.monotonic()


# -- the job (run as ``goodput.py --job ...`` in a process of its own) --------------------------------


def job(args: argparse.Namespace) -> None:
    """Train the benchmark's model with the row's checkpointing; write every step to the progress file."""
    import lightning.pytorch as pl
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    class Net(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            generator = torch.Generator().manual_seed(0)
            self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
            # The rest of a large model's state: it makes the checkpoints (and their saves) that large.
            self.register_buffer("ballast", torch.randn(int(args.state_mb * 2**20 / 4), generator=generator))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            time.sleep(args.step_ms / 1000)  # the rest of a GPU step, as the CPU sees it
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.net.parameters(), lr=0.01)

    class Progress(pl.Callback):
        def __init__(self) -> None:
            # Open for the job's life; one line per step survives a SIGKILL.
            self.out = open(args.progress, "a", buffering=1)  # noqa: SIM115

        def on_train_batch_end(self, trainer: pl.Trainer, *_: Any) -> None:
            self.out.write(f"{args.attempt} {trainer.global_step} {time.time():.4f}\n")

    pl.seed_everything(1234, workers=True)
    generator = torch.Generator().manual_seed(1)
    n = args.steps * args.batch
    data = TensorDataset(torch.randn(n, 32, generator=generator), torch.randn(n, 1, generator=generator))
    loader = DataLoader(data, batch_size=args.batch, shuffle=True)
    callbacks: list[pl.Callback] = [Progress()]
    plugins: list[Any] = []
    ckpt_path: str | None = None
    if args.row_kind == "plain":
        from lightning.pytorch.callbacks import ModelCheckpoint

        callbacks.append(
            ModelCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=args.every, save_last=True)
        )
        ckpt_path = "last"
    else:
        from lightning_resume import DurableCheckpointIO, PreemptionHandler, RequeueCheckpoint, RunDir
        from lightning_resume.notices import FileNotice, Notices

        every: int | str = "auto" if args.every == 0 else args.every
        expected = args.expected if args.expected > 0 else None
        sources = [FileNotice(args.notice_file, interval=0.05)] if args.row_kind == "notices" else None
        callbacks += [
            RunDir(root=args.root),
            RequeueCheckpoint(
                every_n_train_steps=every, save_on_train_epoch_end=False, expected_interruption_every=expected
            ),
            PreemptionHandler(notices=Notices(sources, margin=1.0)),
        ]
        plugins = [] if args.sync else [DurableCheckpointIO()]
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=args.steps,
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=callbacks,
        plugins=plugins or None,
        default_root_dir=args.root,
    )
    trainer.fit(Net(), train_dataloaders=loader, ckpt_path=ckpt_path)
    if trainer.global_step >= args.steps:
        # Whole or absent: the relaunch loop stops at the sight of it, a preemption may cut the write.
        torch.save(trainer.lightning_module.state_dict(), f"{args.final}.tmp")
        os.replace(f"{args.final}.tmp", args.final)


# -- the preemption process and the relaunch loop -----------------------------------------------------


#: Preemption kinds are drawn in blocks of this many that hold the mix's shares.
KIND_BLOCK = 10


def arrivals(seed: int, mean: float, horizon: float) -> list[float]:
    """Poisson arrival times (mean ``mean`` s apart) up to ``horizon`` s after a row's first launch."""
    rng = random.Random(seed)
    times, now = [], 0.0
    while True:
        now += rng.expovariate(1.0 / mean)
        if now > horizon:
            return times
        times.append(now)


def kind_sequence(seed: int, mix: dict[str, float], count: int) -> list[str]:
    """The kinds of a row's 1st, 2nd, ... preemption: shuffled blocks of :data:`KIND_BLOCK` holding the
    mix's shares (largest remainders), so that every kind with a share comes early and often."""
    rng = random.Random(f"kinds-{seed}")
    total = sum(mix.values())
    exact = {kind: KIND_BLOCK * weight / total for kind, weight in mix.items()}
    block = {kind: int(share) for kind, share in exact.items()}
    short = KIND_BLOCK - sum(block.values())
    for kind in sorted(exact, key=lambda k: exact[k] - block[k], reverse=True)[:short]:
        block[kind] += 1
    kinds: list[str] = []
    while len(kinds) < count:
        chunk = [kind for kind, n in block.items() for _ in range(n)]
        rng.shuffle(chunk)
        kinds += chunk
    return kinds[:count]


@dataclass(frozen=True)
class Row:
    """A configuration: ``kind`` ``plain``, ``ours`` or ``notices``; ``every`` N, or 0 for ``"auto"``."""

    kind: str
    every: int

    @property
    def name(self) -> str:
        if self.kind == "plain":
            return f"plain Lightning every {self.every}"
        cadence = "auto" if self.every == 0 else f"every {self.every}"
        return f"ours {cadence}" + (" + notices" if self.kind == "notices" else "")


@dataclass
class Launch:
    """One attempt as the relaunch loop saw it."""

    started: float  # time.time() at the launch
    ended_by: str | None = None  # the kind of the preemption delivered to it
    returncode: int | None = None


@dataclass
class Outcome:
    """What one row did."""

    row: Row
    wall: float
    launches: list[Launch]
    progress: dict[int, list[tuple[int, float]]] = field(default_factory=dict)  # attempt: (step, time)
    finished: bool = False
    exact: bool | None = None
    report_goodput: float | None = None
    save_seconds: float | None = None  # the save stall attempts.json recorded (our rows)
    auto_steps: list[int] = field(default_factory=list)  # the interval "auto" chose, attempt by attempt

    def losses(self) -> list[tuple[str | None, int]]:
        """Per attempt that trained: the preemption that ended it and the steps it lost."""
        trained = [a for a in sorted(self.progress) if self.progress[a]]
        found = []
        for index, attempt in enumerate(trained):
            steps = self.progress[attempt]
            reached = steps[-1][0]
            later = [self.progress[a][0][0] - 1 for a in trained[index + 1 :]]  # the steps they resumed from
            kept_to = min(later) if later else reached
            found.append((self.launches[attempt - 1].ended_by, max(reached - max(kept_to, 0), 0)))
        return found

    def kept_times(self) -> list[float]:
        """When each step of the final result was trained, in s since the first launch, in order.

        A step trained by several attempts counts once: the copy the final weights descend from (an
        attempt keeps its steps up to the step the next attempts resumed from).
        """
        if not self.launches:
            return []
        origin = self.launches[0].started
        trained = [a for a in sorted(self.progress) if self.progress[a]]
        found = []
        for index, attempt in enumerate(trained):
            later = [self.progress[a][0][0] - 1 for a in trained[index + 1 :]]
            kept_to = min(later) if later else math.inf
            found += [when - origin for step, when in self.progress[attempt] if step <= kept_to]
        return sorted(found)

    def restart_overhead(self) -> float | None:
        """Mean of the relaunches' time from launch to the end of their first step."""
        times = [
            self.progress[a][0][1] - self.launches[a - 1].started
            for a in sorted(self.progress)
            if a > 1 and self.progress[a]
        ]
        return statistics.mean(times) if times else None


def _kill(pid: int, sig: signal.Signals, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig) if group else os.kill(pid, sig)


def run_row(
    row: Row, times: list[float], kinds: list[str], args: argparse.Namespace, work: Path, expected: float
) -> Outcome:
    """Run ``row`` under preemptions at ``times`` (s since its first launch) until the job finishes (or
    ``--row-timeout``), relaunching it; its n-th preemption is of the kind ``kinds[n]``."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    stub = work / "bin"
    stub.mkdir()
    (stub / "scontrol").write_text('#!/bin/sh\necho "stub scontrol $*"\nexit 0\n')
    (stub / "scontrol").chmod(0o755)
    progress, final, notice = work / "progress.log", work / "final.pt", work / "preempted"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "LIGHTNING_RESUME_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env["PYTHONWARNINGS"] = "ignore"
    if row.kind == "plain":
        # SLURMEnvironment is detected from these; the stub scontrol answers its requeue.
        env.update(
            SLURM_JOB_ID="4242",
            SLURM_NTASKS="1",
            SLURM_JOB_NAME="goodput",
            SLURM_NODELIST="localhost",
            SLURM_PROCID="0",
            SLURM_LOCALID="0",
            SLURM_NODEID="0",
            PATH=f"{stub}{os.pathsep}{env['PATH']}",
        )
    else:
        env["LIGHTNING_RESUME_KEY"] = "goodput"
        # A SLURM job id and the stub, as for the plain row: the restart count below is how a relaunch
        # killed during its imports (before RunDir) is still counted by "auto" (a gap in the count).
        env.update(SLURM_JOB_ID="4242", PATH=f"{stub}{os.pathsep}{env['PATH']}")
    pending, delivered = list(times), 0
    launches: list[Launch] = []
    origin = time.monotonic()
    while not final.exists():
        if time.monotonic() - origin > args.row_timeout:
            break
        now = time.monotonic() - origin
        notice.unlink(missing_ok=True)
        launch = Launch(time.time())
        launches.append(launch)
        if args.clock == "launch":
            # The n-th launch lives the n-th gap between arrivals: memoryless arrivals dropped while no
            # job runs are that same process, and every row's n-th attempt then meets the same one.
            n = len(launches) - 1
            pending = [now + times[n] - (times[n - 1] if n else 0.0)] if n < len(times) else []
        else:
            pending = [at for at in pending if at > now]  # nothing to preempt between attempts
        command = [
            sys.executable, __file__, "--job", "--row-kind", row.kind, "--every", str(row.every),
            "--attempt", str(len(launches)), "--progress", str(progress), "--final", str(final),
            "--root", str(work / "runs"), "--ckpt-dir", str(work / "ckpt"), "--notice-file", str(notice),
            "--steps", str(args.steps), "--step-ms", str(args.step_ms), "--state-mb", str(args.state_mb),
            "--batch", str(args.batch), "--expected", str(0 if args.no_prior else expected),
        ] + (["--sync"] if args.sync else [])  # fmt: skip
        # SLURM's count of requeues, unset at the first launch.
        restarts = {"SLURM_RESTART_COUNT": str(len(launches) - 1)} if len(launches) > 1 else {}
        with open(work / "job.log", "a") as log:
            proc = subprocess.Popen(
                command, env={**env, **restarts}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        scheduled: list[tuple[float, signal.Signals, bool]] = []
        warning: tuple[float, float] | None = None  # a notice given: its deadline, when last written
        while proc.poll() is None:
            now = time.monotonic() - origin
            while pending and pending[0] <= now:
                pending.pop(0)
                if launch.ended_by is not None:
                    continue  # already being stopped
                kind = kinds[delivered % len(kinds)]
                delivered += 1
                launch.ended_by = kind
                if kind == "sigkill":
                    _kill(proc.pid, signal.SIGKILL, group=True)
                elif kind == "sigterm":
                    _kill(proc.pid, signal.SIGTERM, group=False)
                    scheduled.append((now + args.grace, signal.SIGKILL, True))
                else:
                    if row.kind == "plain":
                        _kill(proc.pid, signal.SIGUSR1, group=False)
                    else:
                        warning = (time.time() + args.notice_lead, -math.inf)
                    scheduled.append((now + args.notice_lead, signal.SIGTERM, False))
                    scheduled.append((now + args.notice_lead + args.notice_grace, signal.SIGKILL, True))
            if warning is not None and time.time() < warning[0] and time.monotonic() - warning[1] >= 0.5:
                # Written again until the SIGTERM, as a metadata endpoint keeps answering: a FileNotice
                # ignores a file older than itself, which a job still importing would otherwise see.
                (work / "preempted.tmp").write_text(f"{warning[0]:.3f}\n")
                os.replace(work / "preempted.tmp", notice)
                warning = (warning[0], time.monotonic())
            for item in [s for s in scheduled if s[0] <= now]:
                scheduled.remove(item)
                _kill(proc.pid, item[1], item[2])
            time.sleep(0.01)
        launch.returncode = proc.returncode
        _kill(proc.pid, signal.SIGKILL, group=True)  # a checkpoint writer left behind: this node is gone
        if not final.exists():
            time.sleep(args.requeue_wait)
    outcome = Outcome(row, time.monotonic() - origin, launches, finished=final.exists())
    for line in progress.read_text().splitlines() if progress.exists() else []:
        attempt, step, when = line.split()
        outcome.progress.setdefault(int(attempt), []).append((int(step), float(when)))
    if row.kind != "plain":
        from lightning_resume.cli.report import report
        from lightning_resume.run_dir import layout

        run_dirs = layout.run_dirs(work / "runs")
        if run_dirs:
            found = report(run_dirs[0])
            outcome.report_goodput, outcome.save_seconds = found.goodput, found.save_seconds
            outcome.auto_steps = [a.cadence_steps for a in found.attempts if a.cadence_steps is not None]
    return outcome


def size_medium(args: argparse.Namespace, work: Path) -> None:
    """``--medium``: the rates and the steps from a probe run's restart cost and step time (see above).

    A row at ``M`` s between preemptions takes about ``U / (1 - k x c / M)`` for ``U`` s of steps
    (``c`` the restart cost, ``k`` :data:`MEDIUM_COST_PER_RESTART`); the reference run ``U + c``.
    """
    probe = argparse.Namespace(**{**vars(args), "steps": PROBE_STEPS, "row_timeout": 600.0})
    outcome = run_row(Row("ours", 0), [], [], probe, work, expected=0.0)
    steps = outcome.progress.get(1, [])
    if not outcome.finished or len(steps) < 2:
        raise SystemExit(f"the probe run did not finish: see {work / 'job.log'}")
    start = steps[0][1] - outcome.launches[0].started
    step = statistics.median(b[1] - a[1] for a, b in itertools.pairwise(steps))
    restart = start + args.requeue_wait
    args.mtbp = args.mtbp or [round(share * restart, 1) for share in MEDIUM_RATES]
    rows = len(args.sweep) + 2 + (1 if args.plain_every else 0)
    stretch = sum(1 / max(1 - MEDIUM_COST_PER_RESTART * restart / m, 0.2) for m in args.mtbp)
    left = 60 * args.budget - (time.monotonic() - START) - start
    useful = max(left / (1 + rows * stretch * len(args.seed)), 10 * step)
    args.steps = args.steps or max(int(useful / step), 2 * max(args.sweep))
    expected = {m: round(useful / max(1 - MEDIUM_COST_PER_RESTART * restart / m, 0.2) / m) for m in args.mtbp}
    print(
        f"--medium: restart cost {restart:.1f} s (start {start:.1f} s + wait {args.requeue_wait:g} s), "
        f"step {step * 1e3:.0f} ms: rates {', '.join(f'{m:g}' for m in args.mtbp)} s, {args.steps} steps, "
        f"about {', '.join(str(n) for n in expected.values())} preemptions per row",
        flush=True,
    )


def same_weights(a: Path, b: Path) -> bool:
    import torch

    left, right = torch.load(a), torch.load(b)
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


# -- tables and the picture ---------------------------------------------------------------------------


def _mean(values: list[int]) -> str:
    return f"{statistics.mean(values):.1f}" if values else "-"


def summarise(outcome: Outcome, useful: float, step: float) -> dict[str, Any]:
    """A row's columns (``at_horizon`` is filled in once every row of its rate has run)."""
    losses = outcome.losses()
    hit = [lost for kind, lost in losses if kind is not None]
    overhead = outcome.restart_overhead()
    return {
        "row": outcome.row.name,
        "goodput": useful / outcome.wall if outcome.finished else None,
        "at_horizon": None,
        "report_goodput": outcome.report_goodput,
        "preemptions": sum(1 for launch in outcome.launches if launch.ended_by),
        "lost_per_preemption": _mean(hit),
        "lost_per_notice": _mean([lost for kind, lost in losses if kind == "notice"]),
        "notice_losses": [lost for kind, lost in losses if kind == "notice"],
        "lost_per_sigkill": _mean([lost for kind, lost in losses if kind == "sigkill"]),
        "restart_overhead": overhead,
        "lost_seconds": step * sum(lost for _, lost in losses),
        "save_seconds": outcome.save_seconds,
        "auto_steps": outcome.auto_steps,
        "wall": outcome.wall,
        "exact": outcome.exact,
        "finished": outcome.finished,
    }


def at_horizon(kept: list[float], horizon: float, step: float) -> float:
    """Goodput over the first ``horizon`` s: the steps of the final result trained by then (``kept``,
    their times since the first launch), at the uninterrupted run's median ``step`` time, over it."""
    return sum(1 for when in kept if when <= horizon) * step / horizon


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def print_rate(mtbp: float, rows: list[dict[str, Any]], horizon: float | None) -> None:
    from lightning_resume.cli.render import table

    at = "-" if horizon is None else f"{horizon:.0f}"
    table(
        f"mean time between preemptions {mtbp:g} s",
        ("row", "goodput", f"at {at} s", "report", "preempt.", "lost/preempt.", "lost/notice", "lost/SIGKILL",
         "restart s", "saves s", "lost s", "auto N", "wall s", "bitwise"),
        [
            (
                r["row"], pct(r["goodput"]) if r["finished"] else "did not finish", pct(r["at_horizon"]),
                pct(r["report_goodput"]), str(r["preemptions"]), r["lost_per_preemption"],
                r["lost_per_notice"], r["lost_per_sigkill"],
                "-" if r["restart_overhead"] is None else f"{r['restart_overhead']:.1f}",
                "-" if r["save_seconds"] is None else f"{r['save_seconds']:.1f}", f"{r['lost_seconds']:.1f}",
                " ".join(map(str, r["auto_steps"])) or "-", f"{r['wall']:.0f}",
                {True: "yes", False: "no", None: "-"}[r["exact"]],
            )
            for r in rows
        ],
    )  # fmt: skip


def best_of(rows: list[dict[str, Any]], prefix: str) -> dict[str, Any] | None:
    found = [r for r in rows if r["row"].startswith(prefix) and r["at_horizon"] is not None]
    return max(found, key=lambda r: r["at_horizon"]) if found else None


def named(rows: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["row"] == name and r["at_horizon"] is not None), None)


@dataclass(frozen=True)
class Spread:
    """The mean of a few values (seeds), its standard error and their range."""

    values: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.mean(self.values)

    @property
    def error(self) -> float | None:
        """The standard error of the mean (``None`` for one value)."""
        if len(self.values) < 2:
            return None
        return statistics.stdev(self.values) / math.sqrt(len(self.values))

    def points(self) -> str:
        """``+1.2 ± 0.8 (-0.5..+2.9)`` in goodput points."""
        if not self.values:
            return "-"
        text = f"{100 * self.mean:+.1f}"
        if self.error is not None:
            text += (
                f" ± {100 * self.error:.1f} ({100 * min(self.values):+.1f}..{100 * max(self.values):+.1f})"
            )
        return text

    def share(self) -> str:
        """``45.2% ± 1.1``."""
        if not self.values:
            return "-"
        return f"{self.mean:.1%}" + ("" if self.error is None else f" ± {100 * self.error:.1f}")


def spread(values: list[float | None]) -> Spread:
    return Spread(tuple(v for v in values if v is not None))


def paired(runs: list[list[dict[str, Any]]], left: str, right: str) -> Spread:
    """``left`` minus ``right`` at the horizon, run by run (a seed's rows met the same preemptions)."""
    found = []
    for rows in runs:
        a, b = named(rows, left), named(rows, right)
        if a is not None and b is not None:
            found.append(a["at_horizon"] - b["at_horizon"])
    return Spread(tuple(found))


def compare(runs: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """One rate over its runs (seeds): every row's mean, and the differences the targets are about.

    The best fixed N is the one with the highest mean over the seeds; ``auto`` is also compared with
    each seed's own best (the max of a few noisy rows: a comparison that favours the sweep).
    """
    names = list(dict.fromkeys(r["row"] for rows in runs for r in rows))
    means = {name: spread([(named(rows, name) or {}).get("at_horizon") for rows in runs]) for name in names}
    fixed = [n for n in names if n.startswith("ours every") and means[n].values]
    best = max(fixed, key=lambda n: means[n].mean) if fixed else None
    plain = next((n for n in names if n.startswith("plain Lightning")), None)
    own_best = []
    for rows in runs:
        found, auto = best_of(rows, "ours every"), named(rows, "ours auto")
        if found is not None and auto is not None:
            own_best.append(auto["at_horizon"] - found["at_horizon"])
    notices = [
        lost
        for rows in runs
        for r in rows
        if r["row"] == "ours auto + notices"
        for lost in r["notice_losses"]
    ]
    return {
        "means": means,
        "best": best,
        "plain": plain,
        "auto_minus_best": paired(runs, "ours auto", best) if best else Spread(()),
        "auto_minus_own_best": Spread(tuple(own_best)),
        "auto_minus_plain": paired(runs, "ours auto", plain) if plain else Spread(()),
        "notices_minus_plain": paired(runs, "ours auto + notices", plain) if plain else Spread(()),
        "best_minus_plain": paired(runs, best, plain) if best and plain else Spread(()),
        "lost_per_notice": statistics.mean(notices) if notices else None,
        "notices": len(notices),
    }


def print_summary(results: dict[int, dict[float, list[dict[str, Any]]]]) -> dict[float, dict[str, Any]]:
    """The rates over the seeds: each row's mean goodput at the horizon, then the targets' differences."""
    from lightning_resume.cli.render import table

    rates = sorted({mtbp for found in results.values() for mtbp in found})
    seeds = len(results)
    summary = {mtbp: compare([found[mtbp] for found in results.values() if mtbp in found]) for mtbp in rates}
    for mtbp, found in summary.items():
        table(
            f"{mtbp:g} s between preemptions, over {seeds} seed(s): goodput at the horizon",
            ("row", "mean ± standard error", "seeds"),
            [(name, spread.share(), str(len(spread.values))) for name, spread in found["means"].items()],
        )
    table(
        f"the targets, over {seeds} seed(s): differences in goodput points at the horizon, seed by seed "
        "(mean ± standard error (range))",
        ("MTBP s", "best fixed", "auto - best", "auto - each seed's best", "best - plain", "auto - plain",
         "auto + notices - plain", "lost/notice"),
        [
            (f"{mtbp:g}", (found["best"] or "-").removeprefix("ours "), found["auto_minus_best"].points(),
             found["auto_minus_own_best"].points(), found["best_minus_plain"].points(),
             found["auto_minus_plain"].points(), found["notices_minus_plain"].points(),
             "-" if found["lost_per_notice"] is None
             else f"{found['lost_per_notice']:.1f} ({found['notices']})")
            for mtbp, found in summary.items()
        ],
    )  # fmt: skip
    return summary


def jsonable(found: dict[str, Any]) -> dict[str, Any]:
    """A rate's :func:`compare` for JSON: every :class:`Spread` as its mean, error and values."""

    def plain(value: Any) -> Any:
        if isinstance(value, Spread):
            return {
                "mean": value.mean if value.values else None,
                "error": value.error,
                "values": value.values,
            }
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return {k: plain(v) for k, v in found.items()}


def plot(summary: dict[float, dict[str, Any]], path: Path) -> Path:
    """Mean goodput at the horizon against the rate, with the standard error over the seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = sorted(summary)
    figure, axes = plt.subplots(figsize=(7, 4.5))
    lines = {
        "plain Lightning": lambda found: found["plain"],
        "ours, best fixed N": lambda found: found["best"],
        "ours auto": lambda found: "ours auto",
        "ours auto + notices": lambda found: "ours auto + notices",
    }
    for label, pick in lines.items():
        points = [
            (rate, means.mean, means.error or 0.0)
            for rate in rates
            if (name := pick(summary[rate])) and (means := summary[rate]["means"].get(name)) and means.values
        ]
        if points:
            axes.errorbar(
                [p[0] for p in points], [100 * p[1] for p in points], yerr=[100 * p[2] for p in points],
                marker="o", capsize=3, label=label,
            )  # fmt: skip
    axes.set_xscale("log")
    axes.set_xlabel("mean time between preemptions (s)")
    axes.set_ylabel("goodput (%)")
    axes.set_title("Goodput under preemption (useful step time / wall time)")
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def run_seed(
    seed: int, rows: list[Row], mix: dict[str, float], args: argparse.Namespace, workdir: Path, step: float
) -> dict[float, list[dict[str, Any]]]:
    """Every rate's rows under the preemptions of ``seed``; the rows' columns, rate by rate."""
    useful = args.steps * step
    results: dict[float, list[dict[str, Any]]] = {}
    for index, mtbp in enumerate(args.mtbp):
        horizon = 50 * args.steps * args.step_ms / 1000 + 100 * mtbp
        stream = seed * 1000 + index  # one per seed and rate (seed 0: 0, 1, ...)
        at = arrivals(stream, mtbp, horizon)
        kinds = kind_sequence(stream, mix, len(at))
        found, kept = [], []
        for row in rows:
            where = workdir / f"seed-{seed}" / f"{mtbp:g}" / row.name.replace(" ", "-")
            outcome = run_row(row, at, kinds, args, where, mtbp)
            final = where / "final.pt"
            outcome.exact = (
                same_weights(final, workdir / "reference" / "final.pt") if outcome.finished else None
            )
            found.append(summarise(outcome, useful, step))
            kept.append(outcome.kept_times())
            print(f"  seed {seed}, {mtbp:g} s, {row.name}: {found[-1]['wall']:.0f} s", flush=True)
            if args.workdir is None:
                shutil.rmtree(where, ignore_errors=True)
        # The horizon: the first row to train its last step. A row's goodput to its finish jumps by a
        # whole restart when its last steps spill into one more attempt; up to a time every row
        # reached, it counts what each kept by then, with no such jump.
        ends = [times[-1] for r, times in zip(found, kept, strict=True) if r["finished"] and times]
        horizon = min(ends) if ends else None
        for r, times in zip(found, kept, strict=True):
            r["at_horizon"] = at_horizon(times, horizon, step) if horizon else None
            r["horizon"] = horizon
        print_rate(mtbp, found, horizon)
        results[mtbp] = found
    return results


# -- main -------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--quick", action="store_true", help="one rate (from the machine's speed), 300 steps, 3 fixed N"
    )
    mode.add_argument(
        "--medium", action="store_true", help="2 rates x 5 rows sized to --budget minutes (see above)"
    )
    parser.add_argument("--budget", type=float, default=30.0, help="--medium: minutes in all")
    parser.add_argument("--mtbp", type=float, nargs="+", default=None, help="mean s between preemptions")
    parser.add_argument("--sweep", type=int, nargs="+", default=None, help="fixed N for our rows")
    parser.add_argument(
        "--plain-every", type=int, default=None, help="N of the plain Lightning row (0: none; --medium: 0)"
    )
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps of the job")
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument(
        "--state-mb", type=float, default=None, help="checkpoint size (MB; default 64, --medium 128)"
    )
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--mix", default="sigterm=0.4,notice=0.3,sigkill=0.3")
    parser.add_argument(
        "--clock",
        choices=("launch", "wall"),
        default="launch",
        help="count the arrivals from each launch (the n-th attempt lives the n-th gap) or from the first",
    )
    parser.add_argument("--grace", type=float, default=10.0, help="SIGTERM to SIGKILL, kind sigterm")
    parser.add_argument("--notice-lead", type=float, default=6.0, help="notice to SIGTERM, kind notice")
    parser.add_argument(
        "--notice-grace", type=float, default=None, help="SIGTERM to SIGKILL, kind notice (0.5; --medium 0.1)"
    )
    parser.add_argument(
        "--requeue-wait", type=float, default=None, help="s between exit and relaunch (2; --medium 1)"
    )
    parser.add_argument(
        "--seed",
        type=int,
        nargs="+",
        default=None,
        help="of the arrivals; several: the rows once per seed, and their means (default: 0; --quick: 1)",
    )
    parser.add_argument(
        "--sync", action="store_true", help="our rows without DurableCheckpointIO (--medium: always)"
    )
    parser.add_argument("--no-prior", action="store_true", help="'auto' without expected_interruption_every")
    parser.add_argument("--row-timeout", type=float, default=None, help="give a row up after this many s")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the runs here (default: temporary)")
    parser.add_argument("--plot", type=Path, default=Path("goodput.png"), help="the PNG written")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    # The job's own arguments.
    parser.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    for name in ("--row-kind", "--progress", "--final", "--root", "--ckpt-dir", "--notice-file"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    parser.add_argument("--every", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--attempt", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--expected", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.job:
        job(args)
        return
    args.mtbp = args.mtbp or (None if args.quick or args.medium else [30.0, 60.0, 120.0, 300.0])
    args.sweep = args.sweep or (
        [25, 50, 100] if args.quick else MEDIUM_SWEEP if args.medium else [10, 25, 50, 100, 200, 400]
    )
    args.plain_every = args.plain_every if args.plain_every is not None else (0 if args.medium else 50)
    args.state_mb = args.state_mb or (128.0 if args.medium else 64.0)
    args.requeue_wait = args.requeue_wait if args.requeue_wait is not None else (1.0 if args.medium else 2.0)
    args.sync = args.sync or args.medium
    # --medium's synchronous saves take about 0.5 s: with 0.5 s of grace, whether a row without notices
    # saves at the SIGTERM is a coin toss worth an interval of steps; with 0.1 s it never does.
    args.notice_grace = args.notice_grace if args.notice_grace is not None else (0.1 if args.medium else 0.5)
    # Seed 1's first arrivals bring each kind of preemption within --quick's few runs' time.
    args.seed = args.seed or [1 if args.quick else 0]
    mix = {kind: float(weight) for kind, _, weight in (p.partition("=") for p in args.mix.split(","))}
    if set(mix) - set(KINDS):
        parser.error(f"--mix kinds are {', '.join(KINDS)}, got {args.mix!r}")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="goodput-"))
    os.environ.setdefault("COLUMNS", "170")  # rich's tables: one line per row in a log file
    started = time.monotonic()
    if args.medium and (args.steps is None or args.mtbp is None):
        try:
            size_medium(args, workdir / "probe")
        except BaseException:
            if args.workdir is None:
                shutil.rmtree(workdir, ignore_errors=True)
            raise
    args.steps = args.steps or (300 if args.quick else 2000)
    args.row_timeout = args.row_timeout or max(600.0, 40 * args.steps * args.step_ms / 1000)
    print(
        f"{args.steps} steps of {args.step_ms:g} ms, {args.state_mb:g} MB checkpoints, preemptions "
        f"{args.mix} (grace {args.grace:g} s; notice {args.notice_lead:g} s ahead, then "
        f"{args.notice_grace:g} s), requeue "
        f"wait {args.requeue_wait:g} s, seed {args.seed}, clock {args.clock}; load average "
        f"{os.getloadavg()[0]:.2f}",
        flush=True,
    )
    try:
        reference = run_row(Row("ours", 0), [], [], args, workdir / "reference", expected=0.0)
        times = [b[1] - a[1] for steps in reference.progress.values() for a, b in itertools.pairwise(steps)]
        step = statistics.median(times)
        print(f"uninterrupted: {reference.wall:.1f} s wall, median step {step * 1e3:.1f} ms", flush=True)
        if not reference.finished:
            raise SystemExit(f"the uninterrupted run did not finish: see {workdir / 'reference' / 'job.log'}")
        if args.mtbp is None:
            # --quick: one rate scaled to this machine (a loaded one starts and steps slower), about two
            # preemptions per uninterrupted run's time.
            args.mtbp = [float(round(QUICK_MTBP_SHARE * reference.wall))]
            print(f"--quick: mean time between preemptions {args.mtbp[0]:g} s", flush=True)
        rows = [*([Row("plain", args.plain_every)] if args.plain_every else []),
                *(Row("ours", n) for n in args.sweep), Row("ours", 0), Row("notices", 0)]  # fmt: skip
        results: dict[int, dict[float, list[dict[str, Any]]]] = {}
        for index, seed in enumerate(args.seed):
            results[seed] = run_seed(seed, rows, mix, args, workdir, step)
            if index + 1 < len(args.seed):
                print_summary(results)  # so far: a run cut short still says what it saw
                print(f"{time.monotonic() - started:.0f} s so far", flush=True)
        summary = print_summary(results)
        print(f"plot: {plot(summary, args.plot).resolve()}")
        if args.json:
            document = {
                "seeds": {
                    str(seed): {str(k): v for k, v in found.items()} for seed, found in results.items()
                },
                "summary": {str(k): jsonable(v) for k, v in summary.items()},
            }
            args.json.write_text(json.dumps(document, indent=2))
        print(f"total {time.monotonic() - started:.0f} s; load average {os.getloadavg()[0]:.2f}")
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
