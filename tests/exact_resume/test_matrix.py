"""The exactness matrix: Lightning feature combinations that real projects use, each killed and relaunched.

Each row runs ``tests/jobs/matrix_job.py`` with one case (a feature combination) once uninterrupted (built
once per case and shared by its rows), then SIGKILLs it at one point and relaunches the same command as a
SLURM restart. The relaunch must resume from the ``last.ckpt`` the kill left (or start over when there is
none), end with bitwise-equal weights, the same global step, the same rows in ``metrics.csv`` and the same
``test`` results, and print no "Resume self-check" warning; a row that cannot be exact (``warns``) must
print that warning once, naming what differs. A failure says what differs and where the relaunch's
batches first part from the uninterrupted run's (``FILE.trace``). The ``fast`` rows run in ``make test``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import Attempt, built_once, job_env, same_weights

JOB = "jobs.matrix_job"
SELF_CHECK = "Resume self-check"  # the warning of an inexact resume


@dataclass(frozen=True)
class Row:
    id: str
    case: str
    kill_at: int
    kill_in: str = "step"  # step, batch, epoch_end, val or sigterm (tests/jobs/matrix_job.py)
    fast: bool = False  # in the default suite; the others are slow
    warns: str | None = None  # cannot be exact: the self-check warning must name this field instead
    xfail: str | None = None  # why it is not exact today
    edge: bool = False  # also on the lowest Lightning and torch declared (make test-edge)
    heavy: bool = False  # with edge: out of make test for time, in make test-edge
    long: bool = False  # out of make test for time, in make test-long


#: What cannot be exact (docs: exact_resume.md, "Where exactness is impossible"): said, not silent.
GLOBAL_DRAWS = "batch"  # an IterableDataset drawing from the global generator in the main process

ROWS = [
    # Ordinary combinations.
    Row("plain-step9", "plain", 9),
    Row("lr_monitor-step7", "lr_monitor", 7),
    Row("grad_clip-step7", "grad_clip", 7),
    Row("user_ckpt_every_n-step7", "user_ckpt_every_n", 7),
    Row("val_check_int-step9", "val_check_int", 9),
    Row("early_stopping-step5", "early_stopping", 5, long=True),
    Row("early_stopping-val9", "early_stopping", 9, "val"),
    Row("manual_two_opt-step14", "manual_two_opt", 14),
    Row("onecycle-step9", "onecycle", 9),
    Row("timer-step9", "timer", 9),
    # 1. A user's ModelCheckpoint(save_last=True) in the run dir's checkpoints/: its save at epoch 0's end
    # (step 6) comes first, before or after ours in the list; "_ours_first": ours does.
    Row("user_save_last_ours_first-epoch_end", "user_save_last_ours_first", 6, "epoch_end"),
    Row("user_save_last_before-epoch_end", "user_save_last_before", 6, "epoch_end"),
    Row("user_save_last_before-step7", "user_save_last_before", 7),
    Row("user_save_last_after-epoch_end", "user_save_last_after", 6, "epoch_end"),
    Row("user_save_last_after-step7", "user_save_last_after", 7),
    # 2. test(ckpt_path="best"/"last") after fit.
    Row("ckpt_best_default-step9", "ckpt_best_default", 9),
    Row("ckpt_best_user-step9", "ckpt_best_user", 9),
    # 3. BackboneFinetuning(unfreeze_backbone_at_epoch=1).
    Row("finetuning-step3", "finetuning", 3),
    Row("finetuning-step15", "finetuning", 15),
    # 3b. Lightning's fine-tuning example (BatchNorm in the backbone, train_bn=False): milestones at epochs
    # 1 and 2 (steps 6 and 12), each stage's BatchNorm layers tracking no statistics while frozen.
    Row("finetuning_bn-step3", "finetuning_bn", 3),
    Row("finetuning_bn-step9", "finetuning_bn", 9, edge=True, long=True),
    Row("finetuning_bn-epoch_end", "finetuning_bn", 12, "epoch_end"),
    Row("finetuning_bn-step15", "finetuning_bn", 15),
    Row("finetuning_bn-sigterm9", "finetuning_bn", 9, "sigterm"),
    # 3c. The tuner callbacks: they search once, before the first step, never again on a resume.
    Row("lr_finder-step9", "lr_finder", 9, fast=True, edge=True),
    Row("lr_finder-epoch_end", "lr_finder", 6, "epoch_end"),
    Row("batch_size_finder-step9", "batch_size_finder", 9),
    Row("batch_size_finder-epoch_end", "batch_size_finder", 6, "epoch_end"),
    # 3d. Lightning #21765: a StatefulDataLoader and OneCycleLR sized by estimated_stepping_batches.
    Row("stateful_onecycle-step9", "stateful_onecycle", 9, edge=True, heavy=True),
    Row("stateful_onecycle-epoch_end", "stateful_onecycle", 6, "epoch_end"),
    # 4. Two training loaders (3 and 8 batches, max_size_cycle).
    Row("combined_loaders-step3", "combined_loaders", 3),
    Row("combined_loaders-step6", "combined_loaders", 6),
    # 5. accumulate_grad_batches=3 (12 batches, 4 optimizer steps an epoch).
    Row("accumulate_steps-batch0", "accumulate_steps", 0, "batch"),
    Row("accumulate_steps-batch1", "accumulate_steps", 1, "batch"),
    Row("accumulate_steps-batch16", "accumulate_steps", 16, "batch"),
    Row("accumulate_minutes-batch1", "accumulate_minutes", 1, "batch"),
    Row("accumulate_minutes-batch16", "accumulate_minutes", 16, "batch"),
    # 6. IterableDataset without state_dict: replayed from the epoch's start.
    Row("iterable_global-step11", "iterable_global", 11, warns=GLOBAL_DRAWS),
    Row("iterable_generator-step11", "iterable_generator", 11),
    Row("iterable_global-step13", "iterable_global", 13),
    Row("iterable_generator-step13", "iterable_generator", 13),
    # 7. persistent_workers=True with random augmentation drawn in the two workers.
    Row("persistent_workers-step9", "persistent_workers", 9, edge=True, heavy=True),
    Row("persistent_workers-epoch_end", "persistent_workers", 12, "epoch_end"),
    Row("persistent_workers-step13", "persistent_workers", 13),
    Row("persistent_workers-step8", "persistent_workers", 8),
    # 8. StochasticWeightAveraging with BatchNorm: SWA in epochs 1-3, the BatchNorm update in epoch 4
    # (batches 24-29).
    Row("swa_bn-step3", "swa_bn", 3),
    Row("swa_bn-step9", "swa_bn", 9),
    # Exact: no gradient is left at that epoch's start (uninterrupted too): its optimizer step is a no-op.
    Row("swa_bn-batch26", "swa_bn", 26, "batch"),
    # 9. Validation logging on_step, mid-epoch validation.
    Row("val_step_logging-step10", "val_step_logging", 10),
    Row("val_step_logging-val9", "val_step_logging", 9, "val"),
]


def _param(row: Row) -> Any:
    later = pytest.mark.heavy if row.heavy else pytest.mark.long if row.long else pytest.mark.slow
    marks: list[Any] = [] if row.fast else [later]
    if row.edge:
        marks.append(pytest.mark.edge)
    if row.xfail:
        marks.append(pytest.mark.xfail(reason=row.xfail, strict=True))
    return pytest.param(row, id=row.id, marks=marks)


def run_matrix(root: Path, out: Path, case: str, *args: str | int, **env: str | int | None) -> Attempt:
    """``python -m jobs.matrix_job`` once, in a session of its own (its kill spares pytest)."""
    cmd = [sys.executable, "-m", JOB, "--root", str(root), "--out", str(out), "--case", case, *map(str, args)]
    proc = subprocess.run(
        cmd, env=job_env(**env), capture_output=True, text=True, timeout=240, start_new_session=True
    )
    meta = Path(f"{out}.json")
    found = json.loads(meta.read_text())["run_dir"] if proc.returncode == 0 and meta.exists() else None
    run_dir = Path(found) if found else None
    return Attempt(proc.returncode, proc.stdout + proc.stderr, run_dir)


def reference(tmp_path_factory: pytest.TempPathFactory, case: str) -> Path:
    """The final weights of ``case`` run once without interruption (built once per test run)."""

    def build(folder: Path) -> None:
        attempt = run_matrix(folder / "runs", folder / "ref.pt", case)
        assert attempt.returncode == 0, attempt.output[-4000:]

    return built_once(tmp_path_factory, f"matrix-{case}", build) / "ref.pt"


def _meta(out: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(Path(f"{out}.json").read_text())
    return result


def _trace(out: Path) -> list[list[dict[str, Any]]]:
    """The lines of ``FILE.trace``, one list per attempt."""
    attempts: list[list[dict[str, Any]]] = []
    for text in Path(f"{out}.trace").read_text().splitlines():
        line = json.loads(text)
        if not attempts or attempts[-1][0]["pid"] != line["pid"]:
            attempts.append([])
        attempts[-1].append(line)
    return attempts


def _saved_step(root: Path) -> int | None:
    """The global step of the ``last.ckpt`` a kill left (``None``: there is none)."""
    found = list(root.glob("[0-9]*/[0-9]*/*/checkpoints/last.ckpt"))
    return torch.load(found[0], weights_only=False)["global_step"] if found else None


def _differences(ref_out: Path, out: Path) -> str:
    """Where the relaunch's batches part from the uninterrupted run's (for the failure messages)."""
    keys = ("data", "weights", "lrs", "trainable")
    (ref,) = _trace(ref_out)
    killed, *rest = _trace(out)
    said = [f"reference: {len(ref)} batches; killed attempt: {len(killed)}"]
    for i, (a, b) in enumerate(zip(killed, ref, strict=False)):
        if any(a[k] != b[k] for k in keys):
            said.append(f"killed attempt parts from the reference at its batch {i}")
            break
    if not rest:
        return "; ".join([*said, "no relaunch trained"])
    restart = rest[0]
    start = next(
        (
            i
            for i, b in enumerate(ref)
            if (b["epoch"], b["batch"], b["step"])
            == (restart[0]["epoch"], restart[0]["batch"], restart[0]["step"])
        ),
        None,
    )
    said.append(
        f"relaunch: {len(restart)} batches from epoch {restart[0]['epoch']} batch {restart[0]['batch']} "
        f"step {restart[0]['step']}"
    )
    if start is None:
        return "; ".join([*said, "the reference has no such batch"])
    said.append(f"the reference has {len(ref) - start} batches from there")
    for i, (a, b) in enumerate(zip(restart, ref[start:], strict=False)):
        parted = [k for k in ("epoch", "batch", "step", *keys) if a[k] != b[k]]
        if parted:
            said.append(
                f"first difference at relaunch batch {i} (epoch {a['epoch']} batch {a['batch']} "
                f"step {a['step']}): {', '.join(f'{k} {a[k]} vs {b[k]}' for k in parted)}"
            )
            break
    else:
        said.append("every batch the same")
    return "; ".join(said)


@pytest.mark.parametrize("row", [_param(row) for row in ROWS])
def test_killed_and_relaunched_run_matches_the_uninterrupted_one(
    row: Row, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ref = reference(tmp_path_factory, row.case)
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    kill = ("--kill-at", row.kill_at, "--kill-in", row.kill_in)
    killed = run_matrix(root, out, row.case, *kill, SLURM_JOB_ID="933")
    assert killed.returncode == (143 if row.kill_in == "sigterm" else -9), killed.output[-4000:]
    saved = _saved_step(root)
    relaunch = run_matrix(root, out, row.case, SLURM_JOB_ID="933", SLURM_RESTART_COUNT=1)
    assert relaunch.returncode == 0, relaunch.output[-4000:]
    meta, ref_meta = _meta(out), _meta(ref)
    assert meta["resumed"], relaunch.output[-4000:]
    if saved is None:  # killed before the first save: the relaunch starts over
        assert meta["first_step"] == 0, relaunch.output[-4000:]
    else:
        assert "resuming from" in relaunch.output, relaunch.output[-4000:]
        assert meta["first_step"] == saved, relaunch.output[-4000:]

    if row.warns is not None:  # not exact: said once, naming what differs
        warnings = [line for line in relaunch.output.splitlines() if SELF_CHECK in line]
        assert len(warnings) == 1 and f"{row.warns}: " in warnings[0], relaunch.output[-4000:]
        return
    problems = []
    if not same_weights(out, ref):
        problems.append("weights differ")
    if meta["global_step"] != ref_meta["global_step"]:
        problems.append(f"{meta['global_step']} optimizer steps vs {ref_meta['global_step']}")
    logged, expected = meta["metrics"], ref_meta["metrics"]
    if logged != expected:
        problems.append(f"logged rows differ: {_metric_differences(expected, logged)}")
    if meta["test"] != ref_meta["test"]:
        problems.append(f"test results differ: {meta['test']} vs {ref_meta['test']}")
    if SELF_CHECK in killed.output + relaunch.output:
        problems.append(f"{SELF_CHECK!r} warned")
    assert not problems, f"{'; '.join(problems)} (resumed from step {saved}; {_differences(ref, out)})"


def _metric_differences(ref: list[dict[str, str]], got: list[dict[str, str]]) -> str:
    missing = [r for r in ref if r not in got]
    extra = [r for r in got if r not in ref]
    return f"{len(got)} rows vs {len(ref)}, missing {missing[:3]}, extra {extra[:3]}"


@pytest.mark.parametrize("case", ["lr_finder", "batch_size_finder"])
def test_a_fresh_run_with_a_tuner_trains_what_lightning_alone_trains(
    case: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The tuner's search saves and restores its own checkpoint through our callbacks' hooks: that is no
    resume, and the run trains exactly what it trains without lightning_resume."""
    plain = run_matrix(tmp_path / "plain", tmp_path / "plain.pt", case, "--plain")
    assert plain.returncode == 0, plain.output[-4000:]
    ours = reference(tmp_path_factory, case)
    assert _same_batches(tmp_path / "plain.pt", ours), "the batches or weights part"
    assert same_weights(tmp_path / "plain.pt", ours)


def _same_batches(a: Path, b: Path) -> bool:
    keys = ("epoch", "batch", "step", "data", "weights", "lrs")
    (first,), (second,) = _trace(a), _trace(b)
    return [[x[k] for k in keys] for x in first] == [[x[k] for k in keys] for x in second]
