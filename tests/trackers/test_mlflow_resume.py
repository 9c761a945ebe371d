"""MLflowResume with lightning_resume.loggers.MLFlowLogger: one MLflow run across restarts, read back
through MLflow's own client from a local file store; a run in another experiment is never written into."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
import torch
from _tracker_data import fit_tiny, only_run_dir, read_sidecar_file, run_tracker_job

from lightning_resume import LightningResumeWarning, MLflowResume
from lightning_resume.loggers import MLFlowLogger
from lightning_resume.run_dir.binding import PROCESS
from lightning_resume.trackers.loggers.mlflow_logger import normalize_uri

pytest.importorskip("mlflow")

STEPS, EVERY = 20, 3
# mlflow 3 keeps the file store only on request; it is the store a test can read without a server.
FILE_STORE = {"MLFLOW_ALLOW_FILE_STORE": "true"}


@pytest.fixture(autouse=True)
def _file_store(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in FILE_STORE.items():
        monkeypatch.setenv(name, value)


def attempt(root: Path, logger: object, steps: int) -> None:
    """One attempt in this process, as a new process would run it (under session key ``job-1``)."""
    PROCESS.reset()
    fit_tiny(root, logger, MLflowResume(), steps=steps)


def runs(uri: str, experiment: str) -> list[object]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else list(client.search_runs([found.experiment_id]))


def history(uri: str, run_id: str, key: str = "echo") -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    points = sorted(MlflowClient(uri).get_metric_history(run_id, key), key=lambda m: (m.timestamp, m.step))
    return [(m.step, m.value) for m in points]


@pytest.mark.long
def test_one_mlflow_run_through_a_sigkill_and_a_sigterm(tmp_path: Path) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    kill = rng.randint(4, 10)
    term = rng.randint(kill + 2, STEPS - 3)
    chosen = f"seed {seed}: SIGKILL at {kill}, SIGTERM at {term}"
    for attempt, (how, step) in enumerate((("kill", kill), ("term", term), (None, None))):
        args = ["--steps", STEPS, "--every", EVERY, "--project", "exp-a"]
        args += ["--kill-at", step, "--signal", how] if how else []
        result = run_tracker_job(
            tmp_path, "mlflow", *args, SLURM_JOB_ID=71, SLURM_RESTART_COUNT=attempt or None
        )
        assert result.returncode == (-9 if how == "kill" else 0), f"{chosen}\n{result.output[-3000:]}"
    uri = f"file:{tmp_path / 'trackers' / 'mlruns'}"
    (run,) = runs(uri, "exp-a")
    assert run.info.status == "FINISHED"  # type: ignore[attr-defined]
    run_id = run.info.run_id  # type: ignore[attr-defined]
    points = history(uri, run_id)
    assert {step for step, _ in points} == set(range(STEPS)), f"{chosen}: {points}"
    assert all(value == step for step, value in points), f"{chosen}: {points}"
    # MLflow cannot delete points: only the steps the SIGKILLed attempt logged after its last
    # checkpoint are there twice, none around the SIGTERM (a clean stop at a batch boundary).
    twice = sorted(step for step, n in Counter(step for step, _ in points).items() if n > 1)
    assert all(kill - EVERY <= step < kill for step in twice), f"{chosen}: {twice}"
    run_dir = only_run_dir(tmp_path)
    identity = read_sidecar_file(run_dir, "mlflow")["identity"]
    assert identity["id"] == run_id and identity["experiment_name"] == "exp-a"
    assert identity["tracking_uri"] == normalize_uri(uri)
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["callbacks"]["MLflowResume"]["identity"]["id"] == run_id


def test_a_restart_configured_for_another_experiment_gets_a_new_run_there(tmp_path: Path) -> None:
    uri = f"file:{tmp_path / 'mlruns'}"
    attempt(tmp_path / "root", MLFlowLogger("exp-a", tracking_uri=uri), 2)
    with pytest.warns(LightningResumeWarning, match=r"not continuing mlflow run .*experiment_name 'exp-a'"):
        attempt(tmp_path / "root", MLFlowLogger("exp-b", tracking_uri=uri), 4)
    (a,) = runs(uri, "exp-a")
    (b,) = runs(uri, "exp-b")
    assert [step for step, _ in history(uri, a.info.run_id)] == [0, 1]  # type: ignore[attr-defined]
    assert [step for step, _ in history(uri, b.info.run_id)] == [2, 3]  # type: ignore[attr-defined]


def test_lightnings_own_mlflow_logger_is_told_it_cannot_continue(tmp_path: Path) -> None:
    from lightning.pytorch.loggers import MLFlowLogger as LightningMLFlowLogger

    uri = f"file:{tmp_path / 'mlruns'}"
    attempt(tmp_path / "root", LightningMLFlowLogger("exp", tracking_uri=uri), 2)
    with pytest.warns(LightningResumeWarning, match="use lightning_resume.loggers.MLFlowLogger"):
        attempt(tmp_path / "root", LightningMLFlowLogger("exp", tracking_uri=uri), 4)
    assert len(runs(uri, "exp")) == 2


def test_a_deleted_run_is_not_continued(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"file:{tmp_path / 'mlruns'}"
    attempt(tmp_path / "root", MLFlowLogger("exp", tracking_uri=uri), 2)
    (first,) = runs(uri, "exp")
    MlflowClient(uri).delete_run(first.info.run_id)  # type: ignore[attr-defined]
    with pytest.warns(LightningResumeWarning, match="was deleted; a new run is created"):
        attempt(tmp_path / "root", MLFlowLogger("exp", tracking_uri=uri), 4)
    (second,) = runs(uri, "exp")  # search_runs lists active runs only
    assert second.info.run_id != first.info.run_id  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("mlruns", "file:{cwd}/mlruns"),
        ("file:./mlruns", "file:{cwd}/mlruns"),
        ("file://{cwd}/mlruns", "file:{cwd}/mlruns"),
        ("sqlite:///mlflow.db", "sqlite:///{cwd}/mlflow.db"),
        ("sqlite:///{cwd}/mlflow.db", "sqlite:///{cwd}/mlflow.db"),
        ("http://mlflow:5000", "http://mlflow:5000"),
    ],
)
def test_normalize_uri_gives_one_spelling_per_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uri: str, expected: str
) -> None:
    monkeypatch.chdir(tmp_path)
    cwd = str(tmp_path.resolve())
    assert normalize_uri(uri.format(cwd=cwd)) == expected.format(cwd=cwd)
