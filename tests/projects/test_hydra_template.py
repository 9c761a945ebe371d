"""A copy of lightning-hydra-template's structure, retrofitted by config only as the Hydra recipe says,
killed and relaunched: it resumes exactly, in one run dir, one output dir, one CSV and one TensorBoard
version, and ``ModelCheckpoint`` keeps its dirpath.

The retrofit is what ``docs/src/recipes/hydra.md`` tells a user of the template to do: save
``hydra_template_resume.yaml`` as ``configs/resume/default.yaml`` and add ``- resume: default`` to the
defaults of ``configs/train.yaml``. Nothing of ``src/`` changes. The test adds only its own kill
(``kill_at.KillAt``) on the command line and runs a small size (3 epochs of 4 batches).
"""

from __future__ import annotations

import csv
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import built_once, job_env

from lightning_resume.run_dir import layout

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "hydra_template"
RECIPE = HERE.parent.parent / "docs" / "src" / "recipes" / "hydra_template_resume.yaml"
#: What the docs tell the user to add to ``configs/train.yaml``'s defaults, after ``- hydra: default``.
DEFAULTS_LINE = "  - hydra: default\n"
EVERY = 3
SIZE = [
    "seed=12345",
    "logger=[csv,tensorboard]",
    "trainer.max_epochs=3",
    "data.train_val_test_split=[256,64,64]",  # 4 batches of 64 per epoch: steps 1-4, 5-8, 9-12
    f"callbacks.requeue_checkpoint.every_n_train_steps={EVERY}",
    "callbacks.rich_progress_bar=null",  # no bar redrawn in the captured output
]
BATCHES = 4
#: Steps whose kill resumes from a save inside an epoch (every 3 steps: the saves at 6 and 9).
MID_EPOCH_KILLS = (7, 10, 11)
#: The dirpath warning of ``ModelCheckpoint`` when a restart saves somewhere else.
DIRPATH_WARNING = "dirpath has changed"


def retrofit(folder: Path) -> Path:
    """The template copied to ``folder``, with the recipe added as the docs say."""
    project = folder / "project"
    shutil.copytree(TEMPLATE, project)
    (project / "configs" / "resume").mkdir()
    shutil.copy(RECIPE, project / "configs" / "resume" / "default.yaml")
    train_yaml = project / "configs" / "train.yaml"
    text = train_yaml.read_text()
    assert text.count(DEFAULTS_LINE) == 1, "the template's train.yaml changed shape"
    train_yaml.write_text(text.replace(DEFAULTS_LINE, DEFAULTS_LINE + "  - resume: default\n"))
    return project


@dataclass
class Launch:
    returncode: int
    output: str


def launch(project: Path, key: str, *overrides: str) -> Launch:
    """``python src/train.py`` in ``project`` under session key ``key``."""
    env = job_env(LIGHTNING_RESUME_KEY=key)
    env["PYTHONPATH"] = f"{HERE}:{env['PYTHONPATH']}"  # kill_at
    proc = subprocess.run(
        [sys.executable, "src/train.py", *SIZE, *overrides],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )
    return Launch(proc.returncode, proc.stdout + proc.stderr)


@dataclass
class Run:
    """What the launches of one session key left: the output, the run dirs, Hydra's output dirs."""

    project: Path
    key: str
    outputs: list[str]

    @property
    def output_dir(self) -> Path:
        return self.project / "logs" / "train" / "runs" / self.key

    def run_dirs(self) -> list[Path]:
        return layout.run_dirs(self.project / "logs" / "resume")

    def checkpoints(self) -> list[Path]:
        """The run dir's ``last.ckpt`` and ``ModelCheckpoint``'s (in Hydra's output dir)."""
        (run_dir,) = self.run_dirs()
        return [run_dir / "checkpoints" / "last.ckpt", self.output_dir / "checkpoints" / "last.ckpt"]

    def rows(self) -> list[dict[str, str]]:
        with open(self.output_dir / "csv" / "version_0" / "metrics.csv", newline="") as f:
            return list(csv.DictReader(f))


def trained(folder: Path, key: str, kill: list[str] | None = None) -> Run:
    """A run of session ``key``: killed by ``kill``'s overrides first, then relaunched; or uninterrupted."""
    project = folder / "project" if (folder / "project").is_dir() else retrofit(folder)
    outputs = []
    if kill is not None:
        first = launch(project, key, "+callbacks.kill._target_=kill_at.KillAt", *kill)
        outputs.append(first.output)
        assert first.returncode != 0, first.output[-3000:]
    last = launch(project, key)
    outputs.append(last.output)
    assert last.returncode == 0, last.output[-3000:]
    return Run(project, key, outputs)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The retrofitted project trained once without interruption (built once per test session)."""

    def build(folder: Path) -> None:
        trained(folder, "reference")

    folder = built_once(tmp_path_factory, "hydra-template-reference", build)
    return Run(folder / "project", "reference", [])


@pytest.fixture(scope="module")
def mid_epoch(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The retrofitted project SIGKILLed at a seeded random step inside an epoch, then relaunched."""
    step = random.Random(21).choice(MID_EPOCH_KILLS)
    return trained(tmp_path_factory.mktemp("mid-epoch"), "mid-epoch", [f"+callbacks.kill.step={step}"])


@pytest.fixture
def project_on_path(reference: Run) -> Iterator[None]:
    """The project's ``src`` importable, to unpickle its checkpoints' hyperparameters; removed after."""
    sys.path.insert(0, str(reference.project))
    yield
    sys.path.remove(str(reference.project))
    for name in [n for n in sys.modules if n == "src" or n.startswith("src.")]:
        del sys.modules[name]


def weights(path: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
    return state


def same_weights(a: Path, b: Path) -> bool:
    left, right = weights(a), weights(b)
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


def without_train_epoch_metrics(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """``rows`` without the values aggregated over a training epoch (issue 21 item 2 makes them exact)."""
    return [{k: v for k, v in row.items() if not k.startswith("train/")} for row in rows]


def assert_resumed_exactly(run: Run, reference: Run, epoch_metrics: bool, saved: bool = True) -> None:
    """Bitwise-equal weights, equal ``metrics.csv`` rows (``epoch_metrics``: also the training epoch's
    aggregates), and one of each folder: run dir, output dir, CSV and TensorBoard version.

    ``saved``: the kill came after the first save (else the restart starts over, in the same run dir).
    """
    (run_dir,) = run.run_dirs()
    restart = run.outputs[-1]
    if saved:
        assert f"Restart of run {run_dir.name}: resuming from" in restart, restart[-3000:]
        assert "Restored all states from the checkpoint" in restart
    assert DIRPATH_WARNING not in restart  # ModelCheckpoint saves where it saved before
    for checkpoint, expected in zip(run.checkpoints(), reference.checkpoints(), strict=True):
        assert same_weights(checkpoint, expected), checkpoint
    # One output dir for all launches, one version of each logger, the hyperparameters kept.
    assert [p.name for p in run.output_dir.parent.iterdir()] == [run.key]
    assert [p.name for p in (run.output_dir / "csv").iterdir()] == ["version_0"]
    assert [p.name for p in (run.output_dir / "tensorboard").iterdir()] == ["version_0"]
    assert (run.output_dir / "csv" / "version_0" / "hparams.yaml").read_text().startswith("model:")
    rows, expected_rows = run.rows(), reference.rows()
    if not epoch_metrics:
        rows, expected_rows = without_train_epoch_metrics(rows), without_train_epoch_metrics(expected_rows)
    assert rows == expected_rows


@pytest.mark.long
@pytest.mark.usefixtures("project_on_path")
def test_mid_epoch_kill_resumes_exactly_in_one_run_dir_and_one_output_dir(
    mid_epoch: Run, reference: Run
) -> None:
    assert_resumed_exactly(mid_epoch, reference, epoch_metrics=False)
    # The template's trainer.test() after fit is no restart and loads its best checkpoint's partials.
    restart = mid_epoch.outputs[-1]
    assert "the Hydra configuration is unchanged" not in restart
    assert "test/acc" in restart


@pytest.mark.long
@pytest.mark.usefixtures("project_on_path")
def test_mid_epoch_kill_logs_the_training_epoch_metrics_of_an_uninterrupted_run(
    mid_epoch: Run, reference: Run
) -> None:
    assert_resumed_exactly(mid_epoch, reference, epoch_metrics=True)


@pytest.mark.slow
@pytest.mark.parametrize("step", sorted(random.Random(4).sample(range(1, 3 * BATCHES), 4)))
@pytest.mark.usefixtures("project_on_path")
def test_kill_at_a_random_step_resumes_exactly(step: int, tmp_path: Path, reference: Run) -> None:
    run = trained(tmp_path, "random", [f"+callbacks.kill.step={step}"])
    assert_resumed_exactly(run, reference, epoch_metrics=False, saved=step > EVERY)


@pytest.mark.slow
@pytest.mark.usefixtures("project_on_path")
def test_sigterm_inside_an_epoch_saves_and_resumes_exactly(tmp_path: Path, reference: Run) -> None:
    run = trained(tmp_path, "sigterm", ["+callbacks.kill.step=6", "+callbacks.kill.how=SIGTERM"])
    assert_resumed_exactly(run, reference, epoch_metrics=False)


@pytest.mark.slow
@pytest.mark.usefixtures("project_on_path")
def test_kill_at_the_next_epochs_start_resumes_from_the_epoch_end_save_exactly(
    tmp_path: Path, reference: Run
) -> None:
    run = trained(
        tmp_path,
        "epoch-start",
        [f"+callbacks.kill.step={BATCHES}", "+callbacks.kill.hook=on_train_epoch_start"],
    )
    assert_resumed_exactly(run, reference, epoch_metrics=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kill",
    [
        pytest.param(["+callbacks.kill.step=4"], id="last-batch-of-an-epoch"),
        pytest.param(
            ["+callbacks.kill.step=8", "+callbacks.kill.hook=on_validation_batch_end"], id="in-its-validation"
        ),
    ],
)
@pytest.mark.usefixtures("project_on_path")
def test_kill_at_an_epoch_boundary_resumes_exactly(kill: list[str], tmp_path: Path, reference: Run) -> None:
    run = trained(tmp_path, "boundary", kill)
    assert_resumed_exactly(run, reference, epoch_metrics=True)
