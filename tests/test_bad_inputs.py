"""The reliability catalogue: every bad input and fault we know of, and what the library does about it.

Each :func:`case` is one row of the table in ``docs/src/troubleshooting.md`` ("What happens when...");
``test_the_troubleshooting_page_lists_every_case`` keeps the page and this file in step. The catalogue
only grows: a defect found later gets a case here first (failing), then its fix.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from _sharded import SHARD, DirectoryStrategy, fit_directories
from _system import can_unshare_mounts, permission_prefix
from conftest import job_env, run_job, same_weights, tiny_trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_resume import (
    CheckpointVerificationError,
    DurableCheckpointIO,
    MissingCallbackError,
    PreemptionHandler,
    RequeueCheckpoint,
    ResumeError,
    RunDir,
    RunDirError,
)
from lightning_resume._run import layout
from lightning_resume._run.binding import PROCESS
from lightning_resume._run.resolve import index_path
from lightning_resume._writer import directory
from lightning_resume._writer.manifest import manifest_path
from lightning_resume.cli import doctor

PAGE = Path(__file__).resolve().parent.parent / "docs" / "src" / "troubleshooting.md"


@dataclass(frozen=True)
class Case:
    """One entry of the catalogue: an input or fault, what happens, and the check that it does."""

    name: str
    given: str
    outcome: str
    check: Callable[[Path], None]


CATALOGUE: list[Case] = []


def case(given: str, outcome: str) -> Callable[[Callable[[Path], None]], Callable[[Path], None]]:
    """Register the decorated check as a catalogue entry (``given`` -> ``outcome``)."""

    def register(check: Callable[[Path], None]) -> Callable[[Path], None]:
        CATALOGUE.append(Case(check.__name__, given, outcome, check))
        return check

    return register


@pytest.mark.parametrize("entry", CATALOGUE, ids=lambda c: c.name)
def test_catalogue(entry: Case, tmp_path: Path) -> None:
    entry.check(tmp_path)


def test_the_troubleshooting_page_lists_every_case() -> None:
    page = " ".join(PAGE.read_text().split())
    missing = [c.name for c in CATALOGUE if f"| {c.given} | {c.outcome} |" not in page]
    assert not missing, f"docs/src/troubleshooting.md has no row '| given | outcome |' for {missing}"


# -- helpers ---------------------------------------------------------------------------------------


def fit(tmp_path: Path, *callbacks: object, steps: int = 2, **trainer: object) -> None:
    """Fit BoringModel for ``steps`` steps with ``callbacks`` (a tiny CPU Trainer)."""
    options: dict[str, object] = {"max_steps": steps, "max_epochs": 3, **trainer}
    tiny_trainer(*callbacks, tmp_path=tmp_path, **options).fit(BoringModel())  # type: ignore[arg-type]


def first_run(tmp_path: Path, key: str = "k", plugin: DurableCheckpointIO | None = None) -> Path:
    """A run of session ``key`` with a committed ``last.ckpt`` at step 2; return its run dir."""
    PROCESS.reset()
    run_dir = RunDir(root=tmp_path / "root", key=key)
    fit(tmp_path, run_dir, RequeueCheckpoint(every_n_train_steps=1), plugins=[plugin] if plugin else None)
    PROCESS.reset()
    return run_dir.path


def restart(tmp_path: Path, key: str = "k", plugin: DurableCheckpointIO | None = None) -> None:
    """A restart of session ``key`` (a new process, as far as the library can tell)."""
    PROCESS.reset()
    fit(
        tmp_path,
        RunDir(root=tmp_path / "root", key=key),
        RequeueCheckpoint(every_n_train_steps=1),
        steps=4,
        plugins=[plugin] if plugin else None,
    )


def cli(*args: object) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_resume", *map(str, args)],
        capture_output=True,
        text=True,
        env=job_env(),
        timeout=120,
    )
    return proc.returncode, proc.stdout, proc.stderr


def script(tmp_path: Path, body: str, *prefix: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run ``body`` as a Python script in its own process (optionally under ``prefix``)."""
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body))
    return subprocess.run(
        [*prefix, sys.executable, str(path)], capture_output=True, text=True, env=job_env(), timeout=timeout
    )


def under_tmpfs(tmp_path: Path, size: str, body: str) -> subprocess.CompletedProcess[str]:
    """Run ``body`` with a private tmpfs of ``size`` mounted at ``tmp_path/small`` (passed as argv[1])."""
    mount = tmp_path / "small"
    mount.mkdir()
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body))
    shell = f'mount -t tmpfs -o size={size} tmpfs "{mount}" && exec "{sys.executable}" "{path}" "{mount}"'
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", shell],
        capture_output=True,
        text=True,
        env=job_env(),
        timeout=300,
    )


needs_tmpfs = pytest.mark.skipif(not can_unshare_mounts(), reason="needs unshare -m to mount a tmpfs")
needs_permissions = pytest.mark.skipif(permission_prefix() is None, reason="cannot drop CAP_DAC_OVERRIDE")


# -- checkpoints and restarts ------------------------------------------------------------------------


@case(
    "SIGKILL of trainer and writer while the first asynchronous save is in flight",
    "the restart starts the run over, in the same run dir, and ends exact",
)
def first_async_save_killed(tmp_path: Path) -> None:
    reference = run_job(tmp_path / "ref", tmp_path / "ref.pt", "--loader", "plain", "--durable")
    assert reference.returncode == 0, reference.output
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    # Saves every 2 steps: the kill at step 3 comes before the writer process has even started.
    first = run_job(root, out, "--loader", "plain", "--durable", "--kill-at", 3, SLURM_JOB_ID=7)
    assert first.returncode == -9, first.output
    (run_dir,) = layout.run_dirs(root)
    if layout.last_checkpoint(run_dir).exists():
        pytest.skip("the writer committed the first save before the kill; the fault did not happen")
    assert not layout.saved_marker(run_dir).exists()
    again = run_job(root, out, "--loader", "plain", "--durable", SLURM_JOB_ID=7, SLURM_RESTART_COUNT=1)
    assert again.returncode == 0, again.output
    assert again.run_dir == run_dir
    assert same_weights(out, tmp_path / "ref.pt")


@case(
    "`last.ckpt` lost after the run committed a checkpoint",
    "`ResumeError` on restart: restore `last.ckpt`, or use another key",
)
def lost_last_checkpoint(tmp_path: Path) -> None:
    run_dir = first_run(tmp_path)
    layout.last_checkpoint(run_dir).unlink()
    with pytest.raises(ResumeError, match="does not exist although the run has saved checkpoints"):
        restart(tmp_path)


@case(
    "restart of a run stopped before its first save",
    "starts from the beginning in the same run dir",
)
def never_saved(tmp_path: Path) -> None:
    run_dir = first_run(tmp_path)
    layout.last_checkpoint(run_dir).unlink()
    layout.saved_marker(run_dir).unlink()
    restart(tmp_path)
    assert torch.load(layout.last_checkpoint(run_dir), weights_only=True)["global_step"] == 4


@case(
    "torn `last.ckpt` with `DurableCheckpointIO`",
    "one warning; the newest committed checkpoint that verifies is loaded",
)
def torn_last_with_plugin(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    io = DurableCheckpointIO(asynchronous=False)
    io.save_checkpoint({"global_step": 1}, folder / "a.ckpt")
    io.save_checkpoint({"global_step": 2}, folder / "last.ckpt")
    with open(folder / "last.ckpt", "ab") as handle:
        handle.write(b"x")
    with pytest.warns(UserWarning, match="torn .* instead, the newest checkpoint that verifies"):
        assert io.load_checkpoint(folder / "last.ckpt")["global_step"] == 1


@case(
    "zero-byte or random `last.ckpt` without the plugin, on restart",
    "`ResumeError` saying the file is damaged and what to do (not torch's `EOFError`)",
)
def damaged_last_without_plugin(tmp_path: Path) -> None:
    run_dir = first_run(tmp_path)
    for content in (b"", os.urandom(4096)):
        layout.last_checkpoint(run_dir).write_bytes(content)
        with pytest.raises(ResumeError, match=r"it is damaged .* no verified copy to fall back to"):
            restart(tmp_path)


@case(
    'a manifest with an out-of-range number (`"global_step": 1e999`)',
    "the checkpoint counts as unverifiable: a clear error on restart, `inspect` works",
)
def manifest_number_out_of_range(tmp_path: Path) -> None:
    run_dir = first_run(tmp_path, plugin=DurableCheckpointIO(asynchronous=False))
    manifest = manifest_path(layout.last_checkpoint(run_dir))
    manifest.write_text(manifest.read_text().replace('"global_step": 2', '"global_step": 1e999'))
    for target in (tmp_path / "root", run_dir):
        code, _, err = cli("inspect", target, "--json")
        assert code == 0, err
    report = json.loads(cli("inspect", run_dir, "--json")[1])
    assert report["checkpoints"][0]["result"] == "unverifiable"
    with pytest.raises(CheckpointVerificationError, match="unverifiable"):
        restart(tmp_path, plugin=DurableCheckpointIO(asynchronous=False))


@case(
    "an unreadable manifest (`{garbage`) next to `last.ckpt`",
    "`inspect` and the restart agree: not loaded; the error says to delete or restore the manifest",
)
def garbage_manifest(tmp_path: Path) -> None:
    run_dir = first_run(tmp_path, plugin=DurableCheckpointIO(asynchronous=False))
    manifest_path(layout.last_checkpoint(run_dir)).write_text("{garbage")
    report = json.loads(cli("inspect", run_dir, "--json")[1])
    assert report["next_restart_loads"]["checkpoint"] is None
    with pytest.raises(CheckpointVerificationError, match="delete the manifest"):
        restart(tmp_path, plugin=DurableCheckpointIO(asynchronous=False))


@case(
    "`last.ckpt` is a dangling symlink, or a directory with a manifest",
    "`inspect` reports it (`missing`, `not a file`), no traceback",
)
def odd_last_checkpoint(tmp_path: Path) -> None:
    run_dir = first_run(tmp_path, plugin=DurableCheckpointIO(asynchronous=False))
    last = layout.last_checkpoint(run_dir)
    last.unlink()
    last.symlink_to(tmp_path / "nowhere.ckpt")
    for target in (tmp_path / "root", run_dir):
        code, _, err = cli("inspect", target)
        assert code == 0 and "Traceback" not in err, err
    assert json.loads(cli("inspect", run_dir, "--json")[1])["checkpoints"][0]["result"] == "missing"
    last.unlink()
    last.mkdir()
    for target in (tmp_path / "root", run_dir):
        code, _, err = cli("inspect", target)
        assert code == 0 and "Traceback" not in err, err
    assert json.loads(cli("inspect", run_dir, "--json")[1])["checkpoints"][0]["result"] == "not a file"


@case(
    "a checkpoint of another run passed on a restart",
    "`ResumeError`: two runs are never mixed",
)
def checkpoint_of_another_run(tmp_path: Path) -> None:
    other = first_run(tmp_path / "other", key="other")
    run_dir = first_run(tmp_path)
    shutil.copy(layout.last_checkpoint(other), layout.last_checkpoint(run_dir))
    with pytest.raises(ResumeError, match="Refusing to mix two runs"):
        restart(tmp_path)


# -- the session index and the runs root ---------------------------------------------------------------


@case(
    "an index entry naming a directory outside `root/runs` (`/etc`, another user's dir)",
    "`RunDirError` naming the entry; nothing is written there",
)
def index_outside_root(tmp_path: Path) -> None:
    first_run(tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    index_path(tmp_path / "root", "k").write_text(f"{outside}\n")
    with pytest.raises(RunDirError, match="not a run dir under"):
        restart(tmp_path)
    assert list(outside.iterdir()) == []


@case(
    "an index entry naming another session's run dir",
    "`RunDirError`: resuming it would mix two jobs",
)
def index_of_another_session(tmp_path: Path) -> None:
    other = first_run(tmp_path, key="other")
    first_run(tmp_path)
    index_path(tmp_path / "root", "k").write_text(f"{other}\n")
    with pytest.raises(RunDirError, match="a run dir of session 'other', not 'k'"):
        restart(tmp_path)


@case(
    "an index entry that is not UTF-8 text",
    "`RunDirError` naming the file",
)
def index_not_utf8(tmp_path: Path) -> None:
    first_run(tmp_path)
    entry = index_path(tmp_path / "root", "k")
    entry.write_bytes(b"\xff\xfe/runs\n")
    with pytest.raises(RunDirError, match=f"{entry.name}' is not UTF-8 text"):
        restart(tmp_path)


@case(
    "an empty index entry, or one naming a deleted run dir",
    "`RunDirError`: write the run dir into it, or delete it to start fresh",
)
def index_empty_or_stale(tmp_path: Path) -> None:
    run_dir = first_run(tmp_path)
    entry = index_path(tmp_path / "root", "k")
    entry.write_text("")
    with pytest.raises(RunDirError, match="is empty"):
        restart(tmp_path)
    entry.write_text(f"{run_dir}\n")
    shutil.rmtree(run_dir)
    with pytest.raises(RunDirError, match="does not exist"):
        restart(tmp_path)


@case(
    "a restart whose index entry is missing while a run dir stamped with its key exists",
    "`RunDirError` listing the dir(s)",
)
def orphan_run_dir(tmp_path: Path) -> None:
    first_run(tmp_path, key="77")
    index_path(tmp_path / "root", "77").unlink()
    os.environ.update(SLURM_JOB_ID="77", SLURM_RESTART_COUNT="1")
    with pytest.raises(RunDirError, match="stamped with this key exist"):
        RunDir(root=tmp_path / "root")


@case(
    '`RunDir(key="")`, a key with a control character, or a 300-character key',
    "`ValueError` naming the key, before anything is created",
)
def bad_keys(tmp_path: Path) -> None:
    for key in ("", " ", "a\nb", "x" * 300):
        with pytest.raises(ValueError, match=re.escape("RunDir(key=...)")):
            RunDir(root=tmp_path / "root", key=key)
    assert not (tmp_path / "root").exists()


@case(
    '`RunDir(key=".")` or `key=".."`',
    "valid keys: escaped in the index (`%2E`), never a directory name",
)
def dot_keys(tmp_path: Path) -> None:
    for key in (".", ".."):
        PROCESS.reset()
        run_dir = RunDir(root=tmp_path / "root", key=key)
        entry = index_path(tmp_path / "root", key)
        assert entry.name.startswith("%2E") and entry.read_text().strip() == str(run_dir.path)


@case(
    "`$LIGHTNING_RESUME_KEY` set to an empty string",
    "treated as unset (the scheduler's ids decide)",
)
def empty_key_variable(tmp_path: Path) -> None:
    os.environ.update(LIGHTNING_RESUME_KEY="", SLURM_JOB_ID="5")
    assert RunDir(root=tmp_path / "root").session_key == "5"


@case(
    "a runs root that is a file",
    "`RunDirError`: pass a directory",
)
def root_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "root").write_text("x")
    with pytest.raises(RunDirError, match="is a file"):
        RunDir(root=tmp_path / "root")


@case(
    "a runs root the user cannot write",
    "`RunDirError` naming the root and the cause",
)
@needs_permissions
def root_not_writable(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    root.chmod(0o555)
    result = script(
        tmp_path,
        f"""
        from lightning_resume import RunDir, RunDirError
        try:
            RunDir(root={str(root)!r})
        except RunDirError as e:
            print("ERROR", e)
        """,
        *permission_prefix() or (),
    )
    root.chmod(0o755)
    assert "ERROR Cannot create a run dir under the runs root" in result.stdout, result.stdout + result.stderr
    assert "Permission denied" in result.stdout and "writable" in result.stdout
    assert list(root.iterdir()) == []


@case(
    "a full disk when a fresh run creates its run dir",
    "`RunDirError` naming the cause; no half-made run dir is left",
)
@needs_tmpfs
def disk_full_on_fresh_run(tmp_path: Path) -> None:
    result = under_tmpfs(
        tmp_path,
        "64k",
        """
        import os, sys
        from lightning_resume import RunDir, RunDirError
        root = sys.argv[1]
        os.makedirs(os.path.join(root, "root", "runs"))
        fd = os.open(os.path.join(root, "filler"), os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"x" * 4096):
                pass
        except OSError:
            os.close(fd)
        try:
            RunDir(root=os.path.join(root, "root"))
        except RunDirError as e:
            print("ERROR", e)
        runs = os.path.join(root, "root", "runs")
        print("LEFT", [p for p, _, _ in os.walk(runs) if p != runs])
        """,
    )
    assert "ERROR Cannot create a run dir" in result.stdout, result.stdout + result.stderr
    assert "free space" in result.stdout
    assert "LEFT []" in result.stdout


@case(
    "`SLURM_RESTART_COUNT=abc` (or another scheduler number that is not one)",
    "`RunDirError` naming the variable; `doctor` reports it as an error",
)
def broken_restart_count(tmp_path: Path) -> None:
    os.environ.update(SLURM_JOB_ID="5", SLURM_RESTART_COUNT="abc")
    with pytest.raises(RunDirError, match="SLURM_RESTART_COUNT='abc' is not a whole number"):
        RunDir(root=tmp_path / "root")
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_resume", "doctor", "--root", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        env={**job_env(), "SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "abc"},
    )
    assert proc.returncode == 1, proc.stderr
    assert any(
        f["level"] == "error" and "SLURM_RESTART_COUNT" in f["detail"] for f in json.loads(proc.stdout)
    )


@case(
    "`LIGHTNING_RESUME_GRACE_SECONDS=2m` (or a torchrun shutdown timeout that is not a whole number)",
    "`doctor` reports a `grace window` error naming the variable; no traceback",
)
def broken_grace_seconds(tmp_path: Path) -> None:
    for variable, env in (
        ("LIGHTNING_RESUME_GRACE_SECONDS", {"LIGHTNING_RESUME_GRACE_SECONDS": "2m"}),
        ("PET_SHUTDOWN_TIMEOUT", {"TORCHELASTIC_RUN_ID": "r", "PET_SHUTDOWN_TIMEOUT": "2.5"}),
    ):
        (finding,) = [f for f in doctor.run_checks(tmp_path, env, 0) if f.check == "grace window"]
        assert finding.level is doctor.Level.ERROR and finding.detail.startswith(f"{variable}=")


@case(
    "two `RunDir`s for one session in one process",
    "one warning; the second shares the first one's run dir (no orphan dir)",
)
def two_run_dirs(tmp_path: Path) -> None:
    os.environ["SLURM_JOB_ID"] = "9"
    first = RunDir(root=tmp_path / "root")
    with pytest.warns(UserWarning, match="A second RunDir for session '9'"):
        second = RunDir(root=tmp_path / "root")
    assert second.path == first.path
    assert layout.run_dirs(tmp_path / "root") == [first.path]


@case(
    "two live attempts sharing one session key",
    "the second gets `RunDirError` naming the live one (pid, host); a killed attempt never blocks",
)
def two_live_attempts(tmp_path: Path) -> None:
    root = tmp_path / "root"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from lightning_resume import RunDir; "
            f"run = RunDir(root={str(root)!r}, key='k'); print('ready', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=job_env(),
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        with pytest.raises(RunDirError, match=f"in use by another live attempt .pid {holder.pid} on"):
            RunDir(root=root, key="k")
    finally:
        holder.kill()
        holder.wait()
    RunDir(root=root, key="k")  # the kernel dropped the dead attempt's lock


# -- callback arguments ------------------------------------------------------------------------------


@case(
    '`RequeueCheckpoint(every_n_train_steps="5" / 2.5 / True)`, `every_n_minutes="1"`',
    "`TypeError` naming the value",
)
def bad_intervals(tmp_path: Path) -> None:
    for value in ("5", 2.5, True):
        with pytest.raises(TypeError, match="every_n_train_steps must be a whole number"):
            RequeueCheckpoint(every_n_train_steps=value)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="every_n_minutes must be a number"):
        RequeueCheckpoint(every_n_minutes="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="every_n_train_steps must be >= 1"):
        RequeueCheckpoint(every_n_train_steps=0)


@case(
    '`DurableCheckpointIO(keep=1.5)`, `keep=0`, a timeout of 0, `mirror=""`',
    "`TypeError` / `ValueError` naming the value",
)
def bad_plugin_options(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="keep must be a whole number"):
        DurableCheckpointIO(keep=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="keep must be >= 1"):
        DurableCheckpointIO(keep=0)
    with pytest.raises(ValueError, match="mirror_timeout must be > 0"):
        DurableCheckpointIO(mirror_timeout=0)
    with pytest.raises(ValueError, match="mirror must be an fsspec URL"):
        DurableCheckpointIO(mirror="")


@case(
    "`PreemptionHandler(exit_code=0 / 256 / True)`",
    "`ValueError` / `TypeError`: the status must be 1..255 (256 would exit 0)",
)
def bad_exit_codes(tmp_path: Path) -> None:
    for code in (0, 256, -1):
        with pytest.raises(ValueError, match=r"exit_code must be within 1\.\.255"):
            PreemptionHandler(exit_code=code)
    with pytest.raises(TypeError, match="exit_code must be a whole number"):
        PreemptionHandler(exit_code=True)


@case(
    '`PreemptionHandler(signals="SIGTERM")` (one name, not a list)',
    'handled as `["SIGTERM"]`',
)
def one_signal_name(tmp_path: Path) -> None:
    handler = PreemptionHandler(signals="SIGTERM")  # type: ignore[arg-type]
    assert handler.signals == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) == handler._handle
    handler.uninstall()


@case(
    '`PreemptionHandler(signals=["SIGKILL"])` or an unknown name',
    "`ValueError`: SIGKILL and SIGSTOP cannot be caught",
)
def uncatchable_signal(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="SIGKILL cannot be caught"):
        PreemptionHandler(signals=["SIGKILL"])
    with pytest.raises(ValueError, match="Unknown signal 'SIGNOPE'"):
        PreemptionHandler(signals=["SIGNOPE"])


@case(
    '`PreemptionHandler(notices="aws")`, `on_notice="save"`, `notice_margin=0`, `AwsSpotNotice(endpoint="")`',
    "`ValueError` / `TypeError` naming the value",
)
def bad_notice_arguments(tmp_path: Path) -> None:
    from lightning_resume.notices import AwsSpotNotice

    with pytest.raises(
        ValueError, match="notices must be 'auto', None or a list of notice sources, got 'aws'"
    ):
        PreemptionHandler(notices="aws")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got \\[1\\]"):
        PreemptionHandler(notices=[1])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="on_notice must be one of 'save_and_continue', 'stop', got 'save'"):
        PreemptionHandler(on_notice="save")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="notice_margin must be > 0, got 0"):
        PreemptionHandler(notice_margin=0)
    with pytest.raises(ValueError, match=r"endpoint must be a base URL .* got ''"):
        AwsSpotNotice(endpoint="")


@case(
    "a notice file left by an earlier attempt (older than the process)",
    "ignored with one warning: the restart trains on",
)
def stale_notice_file(tmp_path: Path) -> None:
    import time
    import warnings

    import lightning.pytorch as pl

    from lightning_resume.notices import FileNotice

    flag = tmp_path / "preempted"
    flag.write_text("")
    os.utime(flag, (1.0, 1.0))
    source = FileNotice(flag, interval=0.01)
    handler = PreemptionHandler(notices=[source], on_notice="stop")

    class WaitForTheWarning(pl.Callback):
        def on_train_batch_end(self, *args: object) -> None:
            deadline = time.monotonic() + 10
            while (
                not [w for w in caught if "older than this process" in str(w.message)]
                and time.monotonic() < deadline
            ):
                time.sleep(0.01)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(
            tmp_path,
            RunDir(root=tmp_path / "root"),
            RequeueCheckpoint(),
            WaitForTheWarning(),
            handler,
            steps=3,
        )
    assert handler.stop_report is None  # trained to the end
    assert len([w for w in caught if "older than this process" in str(w.message)]) == 1


@case(
    "`$SUBMITIT_PREEMPT_SIGNAL` inherited outside submitit",
    "ignored: a SIGTERM preemption still saves and exits 143; `doctor` warns",
)
def stray_submitit_signal(tmp_path: Path) -> None:
    os.environ["SUBMITIT_PREEMPT_SIGNAL"] = "12"

    class Stop(BoringModel):
        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            if self.global_step == 2:
                os.kill(os.getpid(), signal.SIGTERM)
            return super().training_step(batch, batch_idx)

    callbacks = (RunDir(root=tmp_path / "root"), RequeueCheckpoint(), PreemptionHandler())
    trainer = tiny_trainer(*callbacks, tmp_path=tmp_path, max_steps=6, max_epochs=3)
    with pytest.raises(SystemExit) as stopped:
        trainer.fit(Stop())
    assert stopped.value.code == 143
    _, out, err = cli("doctor", "--root", tmp_path, "--json")
    assert "Traceback" not in err
    findings = json.loads(out)
    assert any(f["check"] == "submitit" and f["level"] == "warn" for f in findings)


@case(
    "`SUBMITIT_EXECUTOR=slurm` with `SUBMITIT_PREEMPT_SIGNAL=12`",
    "`doctor` reports an error (submitit expects a name such as USR2), no traceback",
)
def bad_submitit_signal(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_resume", "doctor", "--root", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        env={**job_env(), "SUBMITIT_EXECUTOR": "slurm", "SUBMITIT_PREEMPT_SIGNAL": "12"},
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert any(f["check"] == "submitit" and f["level"] == "error" for f in json.loads(proc.stdout))


@case(
    "`PreemptionHandler` without `RequeueCheckpoint`, or `RequeueCheckpoint` without `RunDir`",
    "`MissingCallbackError` (a `ValueError`) at `setup`, naming what to add",
)
def missing_callbacks(tmp_path: Path) -> None:
    with pytest.raises(MissingCallbackError, match="add RequeueCheckpoint"):
        fit(tmp_path, RunDir(root=tmp_path / "root"), PreemptionHandler())
    with pytest.raises(MissingCallbackError, match="needs exactly one RunDir"):
        fit(tmp_path, RequeueCheckpoint())


# -- faults while training -----------------------------------------------------------------------------


@case(
    "read-only `checkpoints/` without the plugin",
    "`PermissionError` naming the directory (Lightning's writer hides it), `last.ckpt` intact",
)
@needs_permissions
def read_only_checkpoints(tmp_path: Path) -> None:
    result = script(
        tmp_path,
        f"""
        import os, stat
        import lightning.pytorch as pl
        from lightning.pytorch.demos.boring_classes import BoringModel
        from lightning_resume import RequeueCheckpoint, RunDir

        class ReadOnly(pl.Callback):
            # Runs before RequeueCheckpoint's save of step 2 (Lightning calls checkpoint callbacks last).
            def on_train_batch_end(self, trainer, *args):
                if trainer.global_step == 2:
                    os.chmod(run_dir.checkpoint_dir, 0o555)

        run_dir = RunDir(root={str(tmp_path / "root")!r})
        trainer = pl.Trainer(max_steps=6, limit_val_batches=0, logger=False, enable_progress_bar=False,
                             callbacks=[ReadOnly(), run_dir, RequeueCheckpoint(every_n_train_steps=1)],
                             default_root_dir={str(tmp_path)!r})
        try:
            trainer.fit(BoringModel())
        except OSError as e:
            print("ERROR", type(e).__name__, e)
        finally:
            os.chmod(run_dir.checkpoint_dir, 0o755)
        import torch
        print("STEP", torch.load(run_dir.checkpoint_dir / "last.ckpt", weights_only=True)["global_step"])
        """,
        *permission_prefix() or (),
    )
    assert "ERROR PermissionError" in result.stdout, result.stdout + result.stderr
    assert "make" in result.stdout and "writable" in result.stdout
    assert "STEP 1" in result.stdout


@case(
    "a full disk while `RunDir` records the status of a failing fit",
    "the fit's own error is raised; other callbacks' `on_exception` still run",
)
@needs_tmpfs
def status_write_fails_on_exception(tmp_path: Path) -> None:
    result = under_tmpfs(
        tmp_path,
        "1m",
        f"""
        import os, sys
        import lightning.pytorch as pl
        from lightning.pytorch.demos.boring_classes import BoringModel
        from lightning_resume import RunDir

        small = sys.argv[1]

        class Fail(pl.Callback):
            def on_train_batch_end(self, trainer, *args):
                if trainer.global_step == 2:
                    fd = os.open(os.path.join(small, "filler"), os.O_WRONLY | os.O_CREAT)
                    try:
                        while os.write(fd, b"x" * 65536):
                            pass
                    except OSError:
                        os.close(fd)
                    raise KeyError("the user's own error")

        class Witness(pl.Callback):
            def on_exception(self, trainer, pl_module, exception):
                print("WITNESS", type(exception).__name__)

        trainer = pl.Trainer(max_steps=6, limit_val_batches=0, logger=False, enable_progress_bar=False,
                             enable_checkpointing=False, default_root_dir={str(tmp_path)!r},
                             callbacks=[Fail(), RunDir(root=os.path.join(small, "root")), Witness()])
        try:
            trainer.fit(BoringModel())
        except BaseException as e:
            print("RAISED", type(e).__name__, e)
        """,
    )
    assert "RAISED KeyError" in result.stdout, result.stdout + result.stderr
    assert "WITNESS KeyError" in result.stdout


@case(
    "Ctrl-C (`KeyboardInterrupt`) before the first save",
    "the log says no checkpoint was saved yet (a restart starts over); it claims no save",
)
def interrupt_before_first_save(tmp_path: Path) -> None:
    class Interrupt(BoringModel):
        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            raise KeyboardInterrupt

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("lightning_resume").addHandler(handler)
    try:
        trainer = tiny_trainer(
            RunDir(root=tmp_path / "root"), RequeueCheckpoint(every_n_train_steps=5), tmp_path=tmp_path
        )
        with pytest.raises((KeyboardInterrupt, SystemExit)):
            trainer.fit(Interrupt())
    finally:
        logging.getLogger("lightning_resume").removeHandler(handler)
    stopped = [r for r in records if r.startswith("fit stopped by")]
    assert stopped and "no checkpoint was saved yet" in stopped[0], records


@case(
    "files the library writes, under a umask of 022 or 077",
    "mode `0666 & ~umask`, like any file `open()` creates (not `mkstemp`'s private 0600)",
)
def file_modes_follow_the_umask(tmp_path: Path) -> None:
    for umask, expected in ((0o022, 0o644), (0o077, 0o600)):
        result = script(
            tmp_path,
            f"""
            import os, stat
            os.umask({umask})
            import lightning.pytorch as pl
            from lightning.pytorch.demos.boring_classes import BoringModel
            from lightning_resume import RequeueCheckpoint, RunDir
            run_dir = RunDir(root={str(tmp_path / f"root{umask}")!r})
            pl.Trainer(max_steps=2, limit_val_batches=0, logger=False, enable_progress_bar=False,
                       callbacks=[run_dir, RequeueCheckpoint(every_n_train_steps=1)],
                       default_root_dir={str(tmp_path)!r}).fit(BoringModel())
            for path in (run_dir.path / "run_meta.json", run_dir.path / "status.json",
                         run_dir.checkpoint_dir / "last.ckpt"):
                print("MODE", path.name, oct(stat.S_IMODE(os.stat(path).st_mode)))
            """,
        )
        modes = {
            line.split()[1]: line.split()[2] for line in result.stdout.splitlines() if line.startswith("MODE")
        }
        names = ("run_meta.json", "status.json", "last.ckpt")
        assert modes == dict.fromkeys(names, oct(expected)), result.stdout + result.stderr


# -- sharded checkpoints (checkpoint directories) ----------------------------------------------------


def _committed_steps(run_dir: Path) -> list[Path]:
    return directory.candidates(layout.last_checkpoint(run_dir))


@case(
    "a sharded `last.ckpt` (checkpoint directory) with a shard from another save, torn, or without `meta.pt`",
    "one warning; the restart resumes the newest checkpoint directory that verifies and deletes the bad one",
)
def damaged_sharded_last_checkpoint(tmp_path: Path) -> None:
    first, _, _ = fit_directories(tmp_path, steps=3)
    bad, previous = _committed_steps(first.path)[:2]
    shard = bytearray((bad / SHARD).read_bytes())
    shard[len(shard) // 2] ^= 0xFF  # same size, other bytes (as a shard of another save): checksums tell
    (bad / SHARD).write_bytes(bytes(shard))
    step = directory.read_manifest(previous).global_step  # type: ignore[union-attr]
    with pytest.warns(UserWarning, match=r"checkpoint directory that did not verify: .*corrupt") as caught:
        _, started, _ = fit_directories(tmp_path, steps=5)
    assert len([w for w in caught if "did not verify" in str(w.message)]) == 1
    assert started.step == step and not bad.exists()


@case(
    "no checkpoint directory of a restarted sharded run verifies",
    "`CheckpointVerificationError` naming each directory and why; nothing is loaded",
)
def no_sharded_checkpoint_verifies(tmp_path: Path) -> None:
    first, _, _ = fit_directories(tmp_path, steps=3)
    for path in _committed_steps(first.path):
        (path / "meta.pt").unlink()
    with pytest.raises(CheckpointVerificationError, match=r"verifies \(.*incomplete \(meta\.pt is missing\)"):
        fit_directories(tmp_path, steps=5)


@case(
    "`last.ckpt` links to a checkpoint directory that was deleted",
    "`ResumeError` on restart, as for a lost `last.ckpt`; `inspect` reports it `missing`",
)
def dangling_sharded_last_checkpoint(tmp_path: Path) -> None:
    first, _, _ = fit_directories(tmp_path, steps=2)
    shutil.rmtree(layout.last_checkpoint(first.path).resolve())
    report = json.loads(cli("inspect", first.path, "--json")[1])
    assert report["checkpoints"][0]["result"] == "missing"
    with pytest.raises(ResumeError, match="does not exist although the run has saved checkpoints"):
        fit_directories(tmp_path, steps=4)


@case(
    "a sharded save that fails (a full disk) with a strategy that writes directories",
    "the error is raised; `last.ckpt` still links to the previous checkpoint directory, which verifies",
)
def failed_sharded_save(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="No space left on device"):
        fit_directories(tmp_path, steps=3, strategy=DirectoryStrategy(fail_at_save=2))
    (run_dir,) = (tmp_path / "root").glob(layout.RUN_GLOB)
    verdict = directory.verify(layout.last_checkpoint(run_dir))
    assert verdict.status.value == "verified" and verdict.manifest and verdict.manifest.global_step == 1


@case(
    "leftovers of a killed sharded save (`.lr-save-*` of a dead process, a half-deleted `.lr-ckpt-*`)",
    "never loaded; removed by the restart and listed by `lightning-resume gc`",
)
def sharded_save_leftovers(tmp_path: Path) -> None:
    first, _, _ = fit_directories(tmp_path, steps=2)
    folder = layout.checkpoint_dir(first.path)
    leftovers = [folder / ".lr-save-999999999-0badc0de", folder / ".lr-ckpt-00000009-0000dead"]
    for path in leftovers:
        path.mkdir()
        (path / SHARD).write_bytes(b"half")
        os.utime(path, (0, 0))
    code, out, err = cli("gc", tmp_path / "root", "--older-than", "1d", "--json")
    assert code == 0, err
    assert sorted(Path(r["path"]) for r in json.loads(out)["removals"]) == sorted(leftovers)
    _, started, _ = fit_directories(tmp_path, steps=4)
    assert started.step == 2 and not any(p.exists() for p in leftovers)


# -- the command line ---------------------------------------------------------------------------------


@case(
    "`lightning-resume gc --apply` with a directory inside `.handoff`",
    "the directory is left alone; the rest of the plan is applied, no traceback",
)
def gc_with_a_directory_in_handoff(tmp_path: Path) -> None:
    handoff = tmp_path / "root" / layout.HANDOFF_DIR
    (tmp_path / "root" / layout.RUNS).mkdir(parents=True)
    (handoff / "a-dir").mkdir(parents=True)
    (handoff / "old").write_text("{}")
    os.utime(handoff / "old", (0, 0))
    os.utime(handoff / "a-dir", (0, 0))
    code, out, err = cli("gc", tmp_path / "root", "--older-than", "1d", "--apply", "--json")
    assert code == 0 and "Traceback" not in err, err
    assert [Path(r["path"]).name for r in json.loads(out)["removals"]] == ["old"]
    assert (handoff / "a-dir").is_dir()


@case(
    "`inspect` of a missing path, `gc` with a bad age, an unknown option",
    "one line on stderr and exit status 2",
)
def cli_usage_errors(tmp_path: Path) -> None:
    for args in (
        ("inspect", tmp_path / "nope"),
        ("gc", tmp_path, "--older-than", "soon"),
        ("inspect", "--bad"),
    ):
        code, _, err = cli(*args)
        assert code == 2 and len(err.strip().splitlines()) == 1, err


@case(
    '`dirpath="$TMPDIR/ckpt"` (RequeueCheckpoint or DurableCheckpointIO) with `TMPDIR` not set',
    "`ValueError` naming `$TMPDIR`, at construction; no folder called `$TMPDIR` is created",
)
def unset_variable_in_dirpath(tmp_path: Path) -> None:
    assert "LR_TEST_UNSET" not in os.environ
    cwd = os.getcwd()
    os.chdir(tmp_path)  # where a literal "$LR_TEST_UNSET" folder would appear
    try:
        for build in (
            lambda: RequeueCheckpoint(dirpath="$LR_TEST_UNSET/ckpt"),
            lambda: DurableCheckpointIO(dirpath="${LR_TEST_UNSET}/ckpt"),
        ):
            with pytest.raises(ValueError, match=r"uses \$LR_TEST_UNSET, which is not set"):
                build()
    finally:
        os.chdir(cwd)
    assert list(tmp_path.iterdir()) == []


def test_catalogue_entries_are_unique() -> None:
    assert len({c.name for c in CATALOGUE}) == len(CATALOGUE)
    assert len({c.given for c in CATALOGUE}) == len(CATALOGUE)
