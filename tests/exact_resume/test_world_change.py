"""Resume on another number of ranks (issue 25): the rest of the interrupted epoch split over the new ranks.

Every job writes each training batch's sample indices per rank (``--epoch-log``), one file per attempt.
Across the interrupted epoch every index must appear exactly once over all ranks and attempts (the
batches an attempt ran after its last save are redone by the next one, so they do not count), and
every later epoch must be the order an uninterrupted run on the new number of ranks draws: the
``DistributedSampler`` permutation of ``seed + epoch`` split over those ranks (on one process, the
same order with one replica; see ``docs/src/exact_resume.md``).
"""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from conftest import JOB_MODULE, job_env, run_job, same_weights
from torch.utils.data import DistributedSampler

from lightning_resume.cli import inspect
from lightning_resume.exact_resume import global_order, world_change_rng
from lightning_resume.exact_resume.global_order import GlobalOrder, OrderKind

SEED = 1234  # train_job's seed_everything: Lightning's DistributedSampler seed
KEY = "ranks"


@dataclass(frozen=True)
class Batch:
    epoch: int
    step: int
    ranks: int
    rank: int
    indices: tuple[int, ...]


def batches(prefix: Path) -> list[Batch]:
    """The batches an attempt logged (``--epoch-log prefix``), every rank's, in each rank's order."""
    found = []
    for path in sorted(prefix.parent.glob(f"{prefix.name}.rank*")):
        rank = int(path.name.rsplit(".rank", 1)[1])
        for line in path.read_text().splitlines():
            head, _, tail = line.partition(": ")
            if not tail.strip():
                continue  # a line cut by the kill
            epoch, step, ranks = map(int, head.split())
            found.append(Batch(epoch, step, ranks, rank, tuple(map(int, tail.split()))))
    return found


def first_step(output: str) -> int:
    """The global step an attempt resumed from (``Probe``'s line, rank 0)."""
    steps = {int(s) for s in re.findall(r"FIRST_STEP rank=\d+ step=(\d+)", output)}
    assert len(steps) == 1, output[-4000:]
    return steps.pop()


def expected_order(samples: int, ranks: int, rank: int, epoch: int, seed: int = SEED) -> list[int]:
    """What an uninterrupted run on ``ranks`` ranks gives ``rank`` in ``epoch``."""
    sampler = DistributedSampler(range(samples), num_replicas=ranks, rank=rank, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def check_data(
    first: list[Batch], second: list[Batch], resumed_at: int, samples: int, ranks: int, seed: int = SEED
) -> None:
    """Epoch 0 (interrupted) seen exactly once over both attempts; later epochs as on ``ranks`` ranks."""
    kept = [b for b in first if b.epoch == 0 and b.step < resumed_at]  # saved before the kill
    assert kept and all(b.epoch == 0 for b in first), first
    seen = [i for b in kept + [b for b in second if b.epoch == 0] for i in b.indices]
    assert sorted(seen) == list(range(samples)), f"epoch 0 saw {sorted(seen)}"
    later = {b.epoch for b in second} - {0}
    assert later, second
    for epoch in later:
        for rank in range(ranks):
            mine = [i for b in second if b.epoch == epoch and b.rank == rank for i in b.indices]
            assert mine == expected_order(samples, ranks, rank, epoch, seed), (epoch, rank)
    assert {b.ranks for b in second} == {ranks}


# -- the pure rules --------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_the_global_order_is_the_distributed_samplers_for_any_number_of_ranks(world: int) -> None:
    order = global_order.permutation(10, shuffle=True, seed=SEED, epoch=2)
    padded = global_order.split(order, world, 0, drop_last=False)  # rank 0's share
    assert padded == expected_order(10, world, 0, 2)
    for rank in range(world):
        assert global_order.split(order, world, rank, drop_last=False) == expected_order(10, world, rank, 2)


@pytest.mark.parametrize(("world", "consumed"), [(1, 8), (3, 8), (3, 9), (4, 2)])
def test_the_rest_of_an_epoch_split_over_new_ranks_holds_each_remaining_index_once(
    world: int, consumed: int
) -> None:
    order = global_order.permutation(24, shuffle=True, seed=SEED, epoch=0)
    rest = order[consumed:]
    shares = [global_order.split(rest, world, rank, drop_last=False) for rank in range(world)]
    assert {len(s) for s in shares} == {-(-len(rest) // world)}  # padded as DistributedSampler pads
    everything = [i for s in shares for i in s]
    assert set(everything) == set(rest) and len(everything) - len(rest) < world
    cut = [i for rank in range(world) for i in global_order.split(rest, world, rank, drop_last=True)]
    assert len(cut) == len(rest) // world * world and len(set(cut)) == len(cut)


def test_ranks_that_existed_keep_their_states_and_new_ranks_derive_theirs_alike_on_every_restart() -> None:
    saved = [world_change_rng.seeded_state(100 + r) for r in range(2)]
    ranks = [{"rng": state, "draws": []} for state in saved]
    assert world_change_rng.rank_state(ranks, 1, seed=SEED, step=6) is ranks[1]  # type: ignore[arg-type]
    new = world_change_rng.rank_state(ranks, 2, seed=SEED, step=6)  # type: ignore[arg-type]
    again = world_change_rng.rank_state(ranks, 2, seed=SEED, step=6)  # type: ignore[arg-type]
    other = world_change_rng.rank_state(ranks, 3, seed=SEED, step=6)  # type: ignore[arg-type]
    assert torch.equal(new["rng"]["torch"], again["rng"]["torch"])
    assert not torch.equal(new["rng"]["torch"], other["rng"]["torch"])
    assert not torch.equal(new["rng"]["torch"], saved[0]["torch"])
    no_seed = world_change_rng.rank_state(ranks, 2, seed=None, step=6)  # type: ignore[arg-type]
    same = world_change_rng.rank_state(ranks, 2, None, 6)  # type: ignore[arg-type]
    assert torch.equal(no_seed["rng"]["torch"], same["rng"]["torch"])


def test_the_order_record_survives_a_round_trip_and_old_checkpoints_have_none() -> None:
    order = GlobalOrder(OrderKind.PERMUTATION, 24, True, SEED, False, 0, 8, 2, 4, global_batch=8)
    assert GlobalOrder.from_dict(order.to_dict()) == order
    assert GlobalOrder.from_dict(None) is None
    assert GlobalOrder.from_dict({"kind": "something newer"}) is None


# -- real ranks: the Lightning launcher -----------------------------------------------------------

SMALL = ("--samples", 24, "--batch-size", 4, "--epochs", 2, "--every", 1, "--sanity", 0, "--val-samples", 8)
# For 3 ranks: 30 samples in batches of 3, so that neither the 24 left after the first step of 2 ranks
# nor a whole epoch needs padding (DistributedSampler pads by repeating samples).
THIRTY = ("--samples", 30, "--batch-size", 3)


def sizes(ranks: int) -> tuple[tuple[str | int, ...], int]:
    """The data set's knobs and length for a restart on ``ranks`` ranks."""
    return (THIRTY, 30) if ranks == 3 else ((), 24)


def two_attempts(
    tmp_path: Path, before: int, after: int, *extra: str | int, kill_at: int = 2
) -> tuple[list[Batch], list[Batch], int, str]:
    """``before`` ranks killed after step ``kill_at`` (saved: the step before), then ``after`` ranks."""
    root, out = tmp_path / "root", tmp_path / "w.pt"
    args = (*SMALL, "--key", KEY, *extra)
    first = run_job(
        root, out, *args, "--devices", before, "--kill-at", kill_at, "--epoch-log", tmp_path / "a"
    )
    assert first.returncode == -9, first.output[-4000:]
    (run_dir,) = root.glob("[0-9]*/[0-9]*/*")
    assert inspect.verify(run_dir / "checkpoints" / "last.ckpt")["world_size"] == before  # inspect's ranks
    second = run_job(root, out, *args, "--devices", after, "--epoch-log", tmp_path / "b")
    assert second.returncode == 0, second.output[-4000:]
    return batches(tmp_path / "a"), batches(tmp_path / "b"), first_step(second.output), second.output


@pytest.mark.long
def test_two_ranks_killed_mid_epoch_resume_on_one_rank_seeing_every_sample_once(tmp_path: Path) -> None:
    first, second, resumed_at, output = two_attempts(tmp_path, 2, 1, "--loader", "plain")
    assert resumed_at == 1
    check_data(first, second, resumed_at, samples=24, ranks=1)
    assert (
        "Restart on 1 rank(s) of a checkpoint written by 2 rank(s): epoch 0 goes on with the 16 of its "
        "24 samples not yet seen" in output
    )
    assert "global batch 8 -> 4 samples" in output


@pytest.mark.slow
@pytest.mark.parametrize(("loader", "after"), [("plain", 3), ("stateful", 1), ("stateful", 3)])
def test_two_ranks_killed_mid_epoch_resume_on_other_ranks(tmp_path: Path, loader: str, after: int) -> None:
    workers = ("--workers", 2) if loader == "stateful" else ()
    knobs, samples = sizes(after)
    first, second, resumed_at, output = two_attempts(tmp_path, 2, after, "--loader", loader, *workers, *knobs)
    check_data(first, second, resumed_at, samples=samples, ranks=after)
    assert f"Restart on {after} rank(s) of a checkpoint written by 2 rank(s)" in output


@pytest.mark.slow
def test_a_restart_on_other_ranks_draws_alike_every_time(tmp_path: Path) -> None:
    """Two restarts on 3 ranks from the same 2-rank checkpoint: the same weights (new rank 2 included)."""
    root, out = tmp_path / "root", tmp_path / "w.pt"
    args = (*SMALL, "--key", KEY, "--loader", "plain", "--augment")
    first = run_job(root, out, *args, "--devices", 2, "--kill-at", 2)
    assert first.returncode == -9, first.output[-4000:]
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(root), str(copy)], check=True)
    results = []
    for name, where in (("one", root), ("two", copy)):
        again = run_job(where, tmp_path / f"{name}.pt", *args, "--devices", 3)
        assert again.returncode == 0, again.output[-4000:]
        results.append(tmp_path / f"{name}.pt")
    assert same_weights(*results)


@pytest.mark.slow
def test_keep_global_batch_from_two_ranks_to_one_reaches_the_two_rank_weights(tmp_path: Path) -> None:
    """2 -> 1 rank with ``keep_global_batch``: accumulation 2 on one rank, the 2-rank run's weights
    within float tolerance. Not bitwise: DDP averages the two ranks' gradients (all-reduce, then / 2)
    where accumulation sums two halves of the loss, so the additions round in another order."""
    args = (*SMALL, "--loader", "plain", "--no-dropout", "--keep-global-batch")
    reference = run_job(tmp_path / "ref", tmp_path / "ref.pt", *args, "--devices", 2)
    assert reference.returncode == 0, reference.output[-4000:]
    _, _, _, output = two_attempts(tmp_path, 2, 1, *args)
    assert "global batch 8 samples kept (accumulate_grad_batches=2)" in output
    ours, theirs = torch.load(tmp_path / "w.pt"), torch.load(tmp_path / "ref.pt")
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-5, atol=1e-6)


# -- torchrun ------------------------------------------------------------------------------------


def torchrun(tmp_path: Path, nproc: int, *args: str | int, log: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    cmd += ["--max-restarts=0", "-m", JOB_MODULE, "--root", str(tmp_path / "root")]
    cmd += ["--out", str(tmp_path / "w.pt"), *map(str, args), "--devices", str(nproc)]
    cmd += ["--epoch-log", str(tmp_path / log)]
    env = job_env(LIGHTNING_RESUME_KEY=KEY, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, start_new_session=True)


@pytest.mark.slow
@pytest.mark.parametrize("after", [1, 3])
def test_torchrun_two_ranks_killed_mid_epoch_resume_on_other_ranks(tmp_path: Path, after: int) -> None:
    knobs, samples = sizes(after)
    args = (*SMALL, "--loader", "plain", *knobs)
    first = torchrun(tmp_path, 2, *args, "--kill-at", 2, log="a")
    assert first.returncode != 0, first.stdout + first.stderr
    second = torchrun(tmp_path, after, *args, log="b")
    output = second.stdout + second.stderr
    assert second.returncode == 0, output[-4000:]
    resumed_at = first_step(output)
    check_data(batches(tmp_path / "a"), batches(tmp_path / "b"), resumed_at, samples=samples, ranks=after)


@pytest.mark.slow
def test_torchrun_with_a_distributed_sampler_of_ones_own_resumes_on_one_rank(tmp_path: Path) -> None:
    """``use_distributed_sampler=False`` and the user's ``DistributedSampler`` (seed 4321): 2 -> 1 rank."""
    args = (*SMALL, "--loader", "plain", "--own-sampler")
    first = torchrun(tmp_path, 2, *args, "--kill-at", 2, log="a")
    assert first.returncode != 0, first.stdout + first.stderr
    second = torchrun(tmp_path, 1, *args, log="b")
    output = second.stdout + second.stderr
    assert second.returncode == 0, output[-4000:]
    found, resumed_at = batches(tmp_path / "b"), first_step(output)
    check_data(batches(tmp_path / "a"), found, resumed_at, samples=24, ranks=1, seed=4321)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_elastic_torchrun_job_continues_alone_when_one_agent_leaves_mid_epoch(tmp_path: Path) -> None:
    """``--nnodes=1:2``: two agents (one rank each) meet through a c10d store this test hosts; one
    agent and its rank are SIGKILLed mid-epoch, the other re-forms the job alone and finishes it."""
    from torch.distributed import TCPStore

    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, multi_tenant=True, timeout=timedelta(seconds=600))
    agents = []
    for node, extra in enumerate(([], ["--kill-node-at", "2"])):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc-per-node=1"]
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=elastic"]
        cmd += ["--rdzv-conf=is_host=false,join_timeout=120", "--max-restarts=3", "-m", JOB_MODULE]
        cmd += ["--root", str(tmp_path / "root"), "--out", str(tmp_path / "w.pt"), "--nodes-from-env"]
        cmd += [*map(str, SMALL), "--loader", "plain", "--epoch-log", str(tmp_path / "log"), *extra]
        env = job_env(LIGHTNING_RESUME_KEY=KEY, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, TMPDIR=str(tmp_path))
        log = open(tmp_path / f"node{node}.log", "wb")  # noqa: SIM115  # closed below
        agents.append(
            (
                subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True),
                log,
            )
        )
    try:
        deadline = time.monotonic() + 800
        while agents[0][0].poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        for agent, log in agents:
            with contextlib.suppress(ProcessLookupError):
                if agent.poll() is None:
                    agent.kill()
            agent.wait()
            log.close()
        del store
    output = (tmp_path / "node0.log").read_text(errors="replace")
    assert agents[0][0].returncode == 0, output[-6000:]
    assert agents[1][0].returncode != 0
    found = batches(tmp_path / "log")
    resumed_at = max(int(s) for s in re.findall(r"FIRST_STEP rank=\d+ step=(\d+)", output))
    first = [b for b in found if b.ranks == 2]
    second = [b for b in found if b.ranks == 1]
    check_data(first, second, resumed_at, samples=24, ranks=1)
    assert "Restart on 1 rank(s) of a checkpoint written by 2 rank(s)" in output


# -- sharded (ModelParallelStrategy, FSDP2 through DCP) --------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_a_sharded_job_resumes_mid_epoch_on_other_ranks_seeing_every_sample_once(
    tmp_path: Path, before: int, after: int
) -> None:
    def run(devices: int, log: str, *extra: str | int) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "jobs.sharded_job", "--root", str(tmp_path / "root")]
        cmd += ["--out", str(tmp_path / "w.pt"), "--devices", str(devices), "--every", "3"]
        cmd += ["--epoch-log", str(tmp_path / log), *map(str, extra)]
        env = job_env(LIGHTNING_RESUME_KEY=KEY)
        return subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=600, start_new_session=True
        )

    first = run(before, "a", "--kill-after-step", 4)
    assert first.returncode == -9, first.stderr[-4000:]
    second = run(after, "b")
    output = second.stdout + second.stderr
    assert second.returncode == 0, output[-4000:]
    found = batches(tmp_path / "b")
    assert min(b.step for b in found) == 3, found[:2]
    check_data(batches(tmp_path / "a"), found, 3, samples=64, ranks=after)
    assert f"Restart on {after} rank(s) of a checkpoint written by {before} rank(s)" in output
