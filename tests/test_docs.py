"""The documentation builds with ``mkdocs build --strict``, documents the whole public API, and its
recipe files (``docs/src/recipes/``) run as the pages show them: interrupted with a real SIGTERM,
started again, resumed, and compared bitwise with an uninterrupted run.

The SLURM recipes (``sbatch.sh``, ``submitit_launch.py``) are run in ``tests/slurm/test_recipes_slurm.py``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
import yaml
from conftest import job_env

import lightning_resume
import lightning_resume.loggers
from lightning_resume.cli import COMMANDS

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = DOCS / "src"
RECIPES = PAGES / "recipes"
BIN = Path(sys.executable).parent
# Small enough for a few seconds per run, long enough to cross an epoch (32 batches) and to be
# interrupted: with --step-sleep the interrupted attempt is still training when it gets SIGTERM.
SIZE = ("--max-steps", "40", "--every", "4")
SLOW = ("--step-sleep", "0.05")
PREEMPTED = 143


def recipe_files() -> list[Path]:
    return sorted(p for p in RECIPES.iterdir() if p.is_file() and p.suffix != ".md")


def copy_recipes(tmp_path: Path) -> Path:
    """The recipe files in a fresh folder, as a user puts them next to each other."""
    work = tmp_path / "work"
    work.mkdir()
    for path in recipe_files():
        shutil.copy2(path, work / path.name)
    return work


def load_recipe(work: Path, name: str) -> ModuleType:
    """Import the recipe file ``work/<name>.py`` as a module."""
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", work / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Job:
    """A recipe command in a process group of its own, with its output in a file."""

    def __init__(self, cmd: list[str], cwd: Path, log: Path, **env: str) -> None:
        self.log = log
        env = {**job_env(**env), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    @property
    def output(self) -> str:
        return self.log.read_text()

    def kill(self) -> None:
        """SIGKILL the whole process group if it is still running (a failed test leaves nothing behind)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{self.proc.args} still running after {timeout}s:\n{self.output[-3000:]}"
            ) from None

    def wait_for_checkpoint(self, root: Path, timeout: float = 60) -> Path:
        """Wait until some run under ``root`` has a ``last.ckpt`` while this job is still running."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = list(root.glob("[0-9]*/[0-9]*/*/checkpoints/last.ckpt"))
            if found:
                return found[0]
            assert self.proc.poll() is None, (
                f"exited with {self.proc.returncode} first:\n{self.output[-3000:]}"
            )
            time.sleep(0.05)
        raise AssertionError(f"no last.ckpt under {root} after {timeout}s:\n{self.output[-3000:]}")


def run(cmd: list[str], cwd: Path, log: Path, **env: str) -> str:
    job = Job(cmd, cwd, log, **env)
    status = job.wait()
    assert status == 0, f"{cmd} exited with {status}:\n{job.output[-3000:]}"
    return job.output


def preempt(cmd: list[str], cwd: Path, root: Path, log: Path, **env: str) -> str:
    """Start ``cmd``, SIGTERM it once it has saved a checkpoint, and check it stopped as preempted."""
    job = Job(cmd, cwd, log, **env)
    try:
        job.wait_for_checkpoint(root)
        job.proc.send_signal(signal.SIGTERM)
        status = job.wait()
    finally:
        job.kill()
    assert status == PREEMPTED, f"{cmd} exited with {status}, not {PREEMPTED}:\n{job.output[-3000:]}"
    assert "Preempted by SIGTERM" in job.output
    return job.output


def run_dirs(root: Path) -> list[Path]:
    return sorted(root.glob("[0-9]*/[0-9]*/*"))


def same_checkpoints(work: Path, a: Path, b: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``compare.py`` (a recipe too; run in this process, which has torch loaded) finds them identical."""
    compare = load_recipe(work, "compare")
    capsys.readouterr()
    status = compare.main(str(a), str(b))
    printed = capsys.readouterr().out
    assert status == 0 and printed.startswith("identical:"), printed


class Reference:
    """train.py run once without interruption, in the background while the first test runs its own jobs."""

    def __init__(self, tmp_path: Path) -> None:
        self.work = copy_recipes(tmp_path)
        self.root = self.work / "runs"
        cmd = [sys.executable, "train.py", *SIZE]
        self.job = Job(cmd, self.work, tmp_path / "reference.log", LIGHTNING_RESUME_KEY="reference")

    @property
    def checkpoint(self) -> Path:
        status = self.job.wait()
        assert status == 0, self.job.output[-3000:]
        (run_dir,) = run_dirs(self.root)
        return run_dir / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reference]:
    ref = Reference(tmp_path_factory.mktemp("reference"))
    yield ref
    ref.job.kill()


# -- the site ---------------------------------------------------------------------------------------


def test_docs_build_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    proc = subprocess.run(
        [str(BIN / "mkdocs"), "build", "--strict", "-f", str(DOCS / "mkdocs.yml"), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The recipe pages show the tested files themselves (pymdownx.snippets), not copies.
    page = re.sub(r"<[^>]+>", "", (site / "recipes" / "index.html").read_text())
    assert "class RegressionData(pl.LightningDataModule):" in page
    assert "PreemptionHandler(),  # SIGTERM/SIGUSR1" in page
    api = re.sub(r"<[^>]+>", "", (site / "reference" / "run_dir" / "index.html").read_text())
    assert "handoff_timeout" in api


def test_every_recipe_file_is_shown_in_a_page() -> None:
    pages = "\n".join(p.read_text() for p in PAGES.rglob("*.md"))
    included = set(re.findall(r'--8<-- "recipes/([^"]+)"', pages))
    assert included == {p.name for p in recipe_files()}


def test_every_public_class_has_an_api_page() -> None:
    reference = "\n".join(p.read_text() for p in (PAGES / "reference").glob("*.md"))
    public = [name for name in lightning_resume.__all__ if isinstance(getattr(lightning_resume, name), type)]
    public += [f"loggers.{name}" for name in lightning_resume.loggers.__all__]
    missing = [name for name in public if f"::: lightning_resume.{name}\n" not in reference]
    assert not missing, f"no API page (::: lightning_resume.NAME) for {missing}"


def test_every_cli_command_is_documented() -> None:
    cli = (PAGES / "cli.md").read_text()
    missing = [name for name in COMMANDS if f"## `lightning-resume {name}`" not in cli]
    assert not missing, f"docs/src/cli.md has no section for {missing}"


# -- the recipes ------------------------------------------------------------------------------------


@pytest.mark.long
def test_kubernetes_job_runs_train_py_which_resumes_bitwise_after_sigterm(
    tmp_path: Path, reference: Reference, capsys: pytest.CaptureFixture[str]
) -> None:
    work = copy_recipes(tmp_path)
    manifest = yaml.safe_load((work / "k8s-job.yaml").read_text())
    assert (manifest["apiVersion"], manifest["kind"]) == ("batch/v1", "Job")
    assert manifest["spec"]["backoffLimit"] >= 1
    pod = manifest["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "OnFailure"
    assert pod["terminationGracePeriodSeconds"] > 0
    (container,) = pod["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    key = env["LIGHTNING_RESUME_KEY"]
    command = container["command"]
    assert command[:2] == ["python", "train.py"], "exec form: python must be the process that gets SIGTERM"
    args = load_recipe(work, "train").parse_args(command[2:])
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert "persistentVolumeClaim" in volumes[mounts[args.root]], "the runs root must outlive the pod"

    # What the kubelet does: run the command, SIGTERM it (eviction), run it again (restart). The volume
    # is a local folder; the run is shortened by arguments appended to the command.
    root = tmp_path / "pvc"
    cmd = [sys.executable, "train.py", *[str(root) if a == args.root else a for a in command[2:]], *SIZE]
    preempt([*cmd, *SLOW], work, root, tmp_path / "first.log", **env)
    output = run(cmd, work, tmp_path / "second.log", **env)
    assert f"restart of session '{key}'" in output
    assert "Restored all states from the checkpoint" in output
    (run_dir,) = run_dirs(root)
    assert f"finished at step 40 in {run_dir}" in output
    same_checkpoints(work, reference.checkpoint, run_dir / "checkpoints" / "last.ckpt", capsys)


def test_compare_recipe_reports_a_single_changed_bit(
    tmp_path: Path, reference: Reference, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = torch.load(reference.checkpoint, weights_only=True)
    weight = next(iter(checkpoint["state_dict"].values()))
    bits = weight.view(torch.int32)
    bits.view(-1)[0] ^= 1  # the lowest mantissa bit of one number
    changed = tmp_path / "changed.ckpt"
    torch.save(checkpoint, changed)
    compare = load_recipe(RECIPES, "compare")
    assert compare.main(str(reference.checkpoint), str(changed)) == 1
    assert "1 of " in capsys.readouterr().out


@pytest.mark.long
def test_lightning_cli_recipe_resumes_bitwise_after_sigterm(
    tmp_path: Path, reference: Reference, capsys: pytest.CaptureFixture[str]
) -> None:
    work = copy_recipes(tmp_path)
    cmd = [sys.executable, "cli_train.py", "fit", "--config", "cli.yaml", "--trainer.max_steps", "40"]
    preempt(
        [*cmd, "--model.step_sleep", "0.05"],
        work,
        work / "runs",
        tmp_path / "first.log",
        LIGHTNING_RESUME_KEY="cli",
    )
    output = run(cmd, work, tmp_path / "second.log", LIGHTNING_RESUME_KEY="cli")
    assert "restart of session 'cli'" in output
    assert "Restored all states from the checkpoint" in output
    (run_dir,) = run_dirs(work / "runs")
    same_checkpoints(work, reference.checkpoint, run_dir / "checkpoints" / "last.ckpt", capsys)


@pytest.mark.slow
def test_mirror_recipe_restores_a_lost_run_from_the_mirror(
    tmp_path: Path, reference: Reference, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("fsspec")
    work = copy_recipes(tmp_path)
    mirror, root = tmp_path / "bucket", tmp_path / "node-local" / "runs"
    cmd = [sys.executable, "mirror.py", "--mirror", str(mirror), "--root", str(root), *SIZE]
    preempt([*cmd, *SLOW], work, root, tmp_path / "first.log", LIGHTNING_RESUME_KEY="exp-1")
    assert (mirror / "exp-1" / "last.ckpt").is_file()
    shutil.rmtree(root)  # the job comes back on a node without the local disk
    output = run(cmd, work, tmp_path / "second.log", LIGHTNING_RESUME_KEY="exp-1")
    (run_dir,) = run_dirs(root)
    assert f"restored {run_dir / 'checkpoints' / 'last.ckpt'} from" in output
    assert "starts from a checkpoint of run" in output
    assert "Restored all states from the checkpoint" in output
    same_checkpoints(work, reference.checkpoint, run_dir / "checkpoints" / "last.ckpt", capsys)


@pytest.mark.slow
def test_hydra_recipe_resumes_bitwise_in_its_run_dir_from_a_new_output_dir(
    tmp_path: Path, reference: Reference, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("hydra")
    work = copy_recipes(tmp_path)
    cmd = [sys.executable, "hydra_train.py", "max_steps=40", "every=4"]
    key = {"LIGHTNING_RESUME_KEY": "hydra"}
    preempt([*cmd, "step_sleep=0.05"], work, work / "runs", tmp_path / "first.log", **key)
    time.sleep(1)  # Hydra names output dirs by the second: the next launch gets a new one
    output = run(cmd, work, tmp_path / "second.log", **key)
    assert len(list(work.glob("outputs/*/*/.hydra"))) == 2, "one Hydra output dir per launch"
    assert "restart of session 'hydra'" in output
    assert "Restored all states from the checkpoint" in output
    (run_dir,) = run_dirs(work / "runs")
    assert f"finished at step 40 in {run_dir}" in output
    # Hydra's configuration of the run is kept in the run dir, and a restart names what changed.
    assert "the Hydra configuration of run" in output and "step_sleep: 0.05 -> 0.0" in output
    assert yaml.safe_load((run_dir / "hydra_config.yaml").read_text())["step_sleep"] == 0.0
    assert yaml.safe_load((run_dir / "hydra_config.1.yaml").read_text())["step_sleep"] == 0.05
    same_checkpoints(work, reference.checkpoint, run_dir / "checkpoints" / "last.ckpt", capsys)

    # The mistake the recipe avoids: a relative root in the working dir Hydra changes per launch.
    cmd = [
        sys.executable,
        "hydra_train.py",
        "max_steps=1",
        "hydra.job.chdir=true",
        "callbacks.run_dir.root=runs",
    ]
    output = run(cmd, work, tmp_path / "chdir.log", LIGHTNING_RESUME_KEY="lost")
    assert "is inside Hydra's output dir of this launch" in output
    assert "root: ${hydra:runtime.cwd}/runs" in output


def worker_pids(parent: int) -> list[int]:
    """The child processes of ``parent`` (the torchrun agent's workers), from /proc."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            children.append(int(stat.parent.name))
    return children


@pytest.mark.long
def test_torchrun_recipe_restarts_workers_that_resume(tmp_path: Path) -> None:
    work = copy_recipes(tmp_path)
    root = work / "runs"
    # torchrun.sh execs torchrun: the process started here is the elastic agent.
    job = Job(["bash", "torchrun.sh", *SIZE, *SLOW], work, tmp_path / "torchrun.log")
    try:
        job.wait_for_checkpoint(root, timeout=90)
        workers = worker_pids(job.proc.pid)
        assert len(workers) == 2, workers
        os.kill(workers[0], signal.SIGTERM)  # one rank only: all ranks must stop, none may hang
        status = job.wait(timeout=150)
    finally:
        job.kill()
    assert status == 0, job.output[-3000:]
    output = job.output
    assert "Preempted by SIGTERM" in output
    assert "restart of session" in output and "Restored all states from the checkpoint" in output
    (run_dir,) = run_dirs(root)
    assert f"finished at step 40 in {run_dir}" in output
