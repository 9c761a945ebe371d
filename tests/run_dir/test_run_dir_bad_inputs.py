"""What happens when...: RunDir: the runs root, the index, the lock and racing launches.

Cases of the reliability catalogue (``tests/bad_inputs.py``).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from _system import can_unshare_mounts, permission_prefix
from bad_inputs import (
    Case,
    baseline_weights,
    case,
    cases_of,
    first_run,
    fit,
    needs_permissions,
    needs_tmpfs,
    restart,
    run_case,
    script,
    under_tmpfs,
)
from conftest import job_env, run_job, same_weights

from lightning_resume import (
    MissingCallbackError,
    PreemptionHandler,
    RequeueCheckpoint,
    ResumeError,
    RunDir,
    RunDirError,
)
from lightning_resume._scheduler.environment import launch_key, read_session
from lightning_resume.cli import doctor
from lightning_resume.run_dir import layout
from lightning_resume.run_dir.binding import PROCESS
from lightning_resume.run_dir.resolve import create_run, index_path, key_filename, read_index, resolve


@case(
    "an index entry naming a directory outside the root (`/etc`, another user's dir)",
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
        assert entry.name.startswith("%2E") and read_index(tmp_path / "root", key) == run_dir.path


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
    code = f"from lightning_resume import RunDir; run = RunDir(root={str(root)!r}, key='k')"
    with (
        live_holder(code) as holder,
        pytest.raises(RunDirError, match=f"in use by another live attempt .pid {holder.pid} on"),
    ):
        RunDir(root=root, key="k")
    RunDir(root=root, key="k")  # the kernel dropped the dead attempt's lock


@contextlib.contextmanager
def live_holder(code: str) -> Iterator[subprocess.Popen[str]]:
    """A child process that runs ``code`` and then stays alive (holding what it took) until the block ends."""
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import time\n{code}\nprint('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
        env=job_env(),
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        yield holder
    finally:
        holder.kill()
        holder.wait()


class LogLines:
    """The ``lightning_resume`` log records emitted inside the ``with`` block (any level)."""

    def __enter__(self) -> list[str]:
        self.lines: list[str] = []
        self.handler = logging.Handler(logging.DEBUG)
        self.handler.emit = lambda record: self.lines.append(record.getMessage())  # type: ignore[method-assign]
        self.logger = logging.getLogger("lightning_resume")
        self.level = self.logger.level
        self.logger.addHandler(self.handler)
        self.logger.setLevel(logging.INFO)
        return self.lines

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self.level)


class FirstStep(pl.Callback):
    """Record the global step an attempt starts training at."""

    step: int | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.step = trainer.global_step


def relaunch(tmp_path: Path, root: Path, key: str = "k", steps: int = 4) -> tuple[RunDir, int | None]:
    """Launch session ``key`` under ``root`` again (a new process, as far as the library can tell) and
    train to ``steps``; return its ``RunDir`` and the step it started at."""
    PROCESS.reset()
    run_dir, probe = RunDir(root=root, key=key), FirstStep()
    fit(tmp_path, probe, run_dir, RequeueCheckpoint(every_n_train_steps=1), steps=steps)
    PROCESS.reset()
    return run_dir, probe.step


def stamped_dir(root: Path, key: str) -> Path:
    """The run dir a first attempt of ``key`` created before it died, without recording it anywhere."""
    session = read_session({"LIGHTNING_RESUME_KEY": key})
    path, _, lock = create_run(root, session)
    lock.release()
    return path


def one_line(message: str) -> bool:
    return "\n" not in message.strip() and "Traceback" not in message


def under_read_only_mount(tmp_path: Path, folder: Path, body: str) -> subprocess.CompletedProcess[str]:
    """Run ``body`` with ``folder`` bind-mounted read-only in a private mount namespace."""
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body))
    shell = (
        f'mount --bind "{folder}" "{folder}" && mount -o remount,bind,ro "{folder}" && '
        f'exec "{sys.executable}" "{path}"'
    )
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", shell],
        capture_output=True,
        text=True,
        env=job_env(),
        timeout=180,
    )


needs_mounts = pytest.mark.skipif(not can_unshare_mounts(), reason="needs unshare -m to mount read-only")


_REFUSAL = """
    from lightning_resume import RunDir, RunDirError
    try:
        RunDir(root={root!r}, key="k")
        print("TRAINS")
    except RunDirError as e:
        print("ERROR", e)
"""


@case(
    "a relative index entry that climbs out of the root (`../elsewhere/runs/...`)",
    "`RunDirError`: not a run dir under this root; nothing is written there",
)
def index_entry_climbing_out(tmp_path: Path) -> None:
    elsewhere = first_run(tmp_path / "elsewhere")
    first_run(tmp_path)
    entry = index_path(tmp_path / "root", "k")
    entry.write_text(f"{os.path.relpath(elsewhere, tmp_path / 'root')}\n")
    before = sorted(p.name for p in elsewhere.rglob("*"))
    with pytest.raises(RunDirError, match="which is not a run dir under"):
        relaunch(tmp_path, tmp_path / "root")
    assert sorted(p.name for p in elsewhere.rglob("*")) == before


@case(
    "an index entry that is a symlink to another key's entry",
    "`RunDirError`: the run dir it names belongs to the other session",
)
def index_entry_linked_to_another(tmp_path: Path) -> None:
    first_run(tmp_path, key="other")
    first_run(tmp_path)
    entry = index_path(tmp_path / "root", "k")
    entry.unlink()
    entry.symlink_to(index_path(tmp_path / "root", "other"))
    with pytest.raises(RunDirError, match="a run dir of session 'other', not 'k'"):
        relaunch(tmp_path, tmp_path / "root")


@case(
    "the key's `last.ckpt` replaced by one of another run of the same key (a rerun's dir, SLURM)",
    "`ResumeError`: two runs are never mixed, even under one key",
)
def checkpoint_of_a_rerun_of_the_same_key(tmp_path: Path) -> None:
    os.environ["SLURM_JOB_ID"] = "50"
    PROCESS.reset()
    first = RunDir(root=tmp_path / "root")
    fit(tmp_path, first, RequeueCheckpoint(every_n_train_steps=1))
    PROCESS.reset()
    rerun = RunDir(root=tmp_path / "root")  # inside the same allocation: a run dir of its own
    fit(tmp_path, rerun, RequeueCheckpoint(every_n_train_steps=1))
    assert rerun.path != first.path
    shutil.copy(layout.last_checkpoint(rerun.path), layout.last_checkpoint(first.path))
    os.environ["SLURM_RESTART_COUNT"] = "1"
    PROCESS.reset()
    with pytest.raises(ResumeError, match="Refusing to mix two runs"):
        fit(tmp_path, RunDir(root=tmp_path / "root"), RequeueCheckpoint(every_n_train_steps=1), steps=4)


@case(
    "`root/.handoff` is a file when rank 0 of a multi-rank launch publishes its run dir",
    "`RunDirError` in one line naming it (the other ranks would wait in vain), not a traceback",
)
def handoff_folder_is_a_file(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / layout.HANDOFF_DIR).write_text("")
    os.environ.update(SLURM_JOB_ID="60", SLURM_PROCID="0", SLURM_NTASKS="2")
    with pytest.raises(RunDirError, match=r"Cannot publish this launch's run dir") as refused:
        RunDir(root=root)
    assert one_line(str(refused.value))


@case(
    "a run dir copied to a new root without the hidden `.index/` (`cp -r old/* new/`), "
    "relaunched with its key",
    "the run dir stamped with the key is resumed; its index entry is recreated, with one log line",
)
def index_lost_in_a_copy(tmp_path: Path) -> None:
    original = first_run(tmp_path)
    new_root = tmp_path / "new"
    day = original.relative_to(tmp_path / "root").parts[0]
    shutil.copytree(tmp_path / "root" / day, new_root / day)  # what `cp -r old/* new/` copies
    with LogLines() as lines:
        run_dir, started = relaunch(tmp_path, new_root)
    copy = new_root / original.relative_to(tmp_path / "root")
    assert (run_dir.path, run_dir.is_resumed, started) == (copy, True, 2)
    assert read_index(new_root, "k") == copy
    assert len([line for line in lines if "had no index entry" in line]) == 1, lines
    assert layout.run_dirs(new_root) == [copy]


@case(
    "an index entry deleted while several run dirs are stamped with its key",
    "`RunDirError` listing the dirs: write the one to resume into the entry; nothing is created",
)
def index_lost_with_several_stamped_dirs(tmp_path: Path) -> None:
    first = first_run(tmp_path)
    second = stamped_dir(tmp_path / "root", "k")
    index_path(tmp_path / "root", "k").unlink()
    PROCESS.reset()
    with pytest.raises(RunDirError, match="2 run dirs are stamped with this key") as refused:
        RunDir(root=tmp_path / "root", key="k")
    assert str(first) in str(refused.value) and str(second) in str(refused.value)
    assert one_line(str(refused.value))
    assert layout.run_dirs(tmp_path / "root") == sorted([first, second])
    assert not index_path(tmp_path / "root", "k").exists()


@case(
    "an index entry lost while a run dir's `run_meta.json` is unreadable (truncated, not JSON)",
    "`RunDirError` naming that dir: it may be the key's own run; restore the file or move the dir away",
)
def index_lost_with_an_unreadable_run_meta(tmp_path: Path) -> None:
    run = first_run(tmp_path)
    (run / layout.RUN_META).write_text('{"run_id": "')
    index_path(tmp_path / "root", "k").unlink()
    PROCESS.reset()
    with pytest.raises(RunDirError, match=r"cannot be read: that run dir may be this session's own run"):
        RunDir(root=tmp_path / "root", key="k")
    assert layout.run_dirs(tmp_path / "root") == [run]


@case(
    "a restart whose index entry is missing while one run dir stamped with its key exists (SLURM requeue)",
    "that run dir is resumed and its index entry recreated, with one log line",
)
def orphan_run_dir(tmp_path: Path) -> None:
    run = first_run(tmp_path, key="77")
    index_path(tmp_path / "root", "77").unlink()
    os.environ.update(SLURM_JOB_ID="77", SLURM_RESTART_COUNT="1")
    with LogLines() as lines:
        again = RunDir(root=tmp_path / "root")
    assert again.path == run and again.is_resumed
    assert read_index(tmp_path / "root", "77") == run
    assert len([line for line in lines if "had no index entry" in line]) == 1, lines


@case(
    "the runs root moved (`mv old/R new/R`: a scratch purge, a migration, another container mount) "
    "between a kill and the restart",
    "the restart resumes the run at its new place and ends bitwise-exact",
)
def moved_root(tmp_path: Path) -> None:
    old, new = tmp_path / "old" / "R", tmp_path / "new" / "R"
    out = tmp_path / "out.pt"
    first = run_job(old, out, "--key", "k", "--kill-at", 5)
    assert first.returncode == -9, first.output
    new.parent.mkdir()
    old.rename(new)
    again = run_job(new, out, "--key", "k")
    assert again.returncode == 0, again.output
    assert "FIRST_STEP rank=0 step=4" in again.output
    assert again.run_dir is not None and again.run_dir.parents[2] == new
    assert same_weights(out, baseline_weights("stateful"))


@case(
    "a copied runs root (`cp -r`, index included) relaunched at the copy",
    "the copy is resumed; the original is left untouched",
)
def copied_root(tmp_path: Path) -> None:
    run = first_run(tmp_path)
    shutil.copytree(tmp_path / "root", tmp_path / "copy")
    before = layout.last_checkpoint(run).read_bytes()
    again, started = relaunch(tmp_path, tmp_path / "copy")
    assert (again.path, started) == (tmp_path / "copy" / run.relative_to(tmp_path / "root"), 2)
    assert layout.last_checkpoint(run).read_bytes() == before


@case(
    "a runs root reached through a symlink, restarted through its real path (or the other way round)",
    "the same run is resumed: the root is resolved and the index holds paths relative to it",
)
def symlinked_root(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    PROCESS.reset()
    run_dir = RunDir(root=tmp_path / "link", key="k")
    fit(tmp_path, run_dir, RequeueCheckpoint(every_n_train_steps=1))
    again, started = relaunch(tmp_path, tmp_path / "real", steps=3)
    assert (again.path, started) == (run_dir.path, 2)
    again, started = relaunch(tmp_path, tmp_path / "link")
    assert (again.path, started) == (run_dir.path, 3)


@case(
    "a runs root on a path with spaces and non-ASCII characters (`my runs/Gödel 日本`)",
    "fresh runs, index entries and restarts work as anywhere else",
)
def odd_root_path(tmp_path: Path) -> None:
    root = tmp_path / "my runs" / "Gödel 日本"
    PROCESS.reset()
    run_dir = RunDir(root=root, key="k")
    fit(tmp_path, run_dir, RequeueCheckpoint(every_n_train_steps=1))
    again, started = relaunch(tmp_path, root)
    assert (again.path, again.is_resumed, started) == (run_dir.path, True, 2)


@case(
    "session keys that escape to similar file names (`a/b`, `a%2Fb`, `a b`, `ü`)",
    "each gets its own index entry and finds its own run again",
)
def keys_that_escape(tmp_path: Path) -> None:
    root = tmp_path / "root"
    keys = ("a/b", "a%2Fb", "a b", "ü")
    paths = {}
    for key in keys:
        PROCESS.reset()
        paths[key] = RunDir(root=root, key=key).path
    assert len({index_path(root, k).name for k in keys}) == len(set(paths.values())) == len(keys)
    assert all(read_index(root, key) == paths[key] for key in keys)


@case(
    "an index entry edited by hand: a relative path, a trailing slash, Windows line endings",
    "read as the same run dir",
)
def hand_edited_index_entry(tmp_path: Path) -> None:
    run = first_run(tmp_path)
    entry, relative = index_path(tmp_path / "root", "k"), run.relative_to(tmp_path / "root")
    for text in (f"{relative}/\r\n", f"  {run}  \r\n", f"./{relative}"):
        entry.write_text(text)
        again = resolve(tmp_path / "root", read_session({}, "k"))
        assert again.path.resolve() == run and again.is_resumed, text


@case(
    "an index entry that is a folder, or a `.index` that is a file",
    "`RunDirError` in one line saying which to remove (not a permission hint)",
)
def index_entry_of_the_wrong_kind(tmp_path: Path) -> None:
    root = tmp_path / "root"
    index_path(root, "k").mkdir(parents=True)
    with pytest.raises(RunDirError, match="the entry is a folder, not a file: remove it"):
        RunDir(root=root, key="k")
    shutil.rmtree(root / layout.INDEX_DIR)
    (root / layout.INDEX_DIR).write_text("")
    with pytest.raises(RunDirError, match=r"\.index' is not a folder: move that file away"):
        RunDir(root=root, key="k")
    assert layout.run_dirs(root) == []


@case(
    "an index entry naming a folder without `run_meta.json` under the root",
    "`RunDirError`: not a run dir (or damaged); restore `run_meta.json` or fix the entry",
)
def index_entry_without_run_meta(tmp_path: Path) -> None:
    run = first_run(tmp_path)
    (run / layout.RUN_META).unlink()
    with pytest.raises(RunDirError, match=r"whose run_meta\.json cannot be read"):
        relaunch(tmp_path, tmp_path / "root")


@case(
    "an index entry naming a run dir whose `run_meta.json` belongs to another run "
    "(copied over, or the dir renamed)",
    "`RunDirError` naming both run ids: rename the dir back or restore its own `run_meta.json`",
)
def run_meta_of_another_run(tmp_path: Path) -> None:
    run = first_run(tmp_path)
    other = stamped_dir(tmp_path / "root", "k")
    shutil.copy(other / layout.RUN_META, run / layout.RUN_META)
    with pytest.raises(RunDirError, match=f"belongs to run '{other.name}', not to '{run.name}'"):
        relaunch(tmp_path, tmp_path / "root")


@case(
    "an index entry naming a run dir of the same key in another root (an absolute path that exists)",
    "`RunDirError`: not a run dir under this root; nothing is written there",
)
def index_entry_into_another_root(tmp_path: Path) -> None:
    elsewhere = first_run(tmp_path / "elsewhere")
    first_run(tmp_path)
    index_path(tmp_path / "root", "k").write_text(f"{elsewhere}\n")
    before = sorted(p.name for p in elsewhere.rglob("*"))
    with pytest.raises(RunDirError, match="which is not a run dir under"):
        relaunch(tmp_path, tmp_path / "root")
    assert sorted(p.name for p in elsewhere.rglob("*")) == before


@case(
    "an index entry naming a deleted run dir while another dir stamped with the key exists",
    "`RunDirError`: the entry is not guessed around; restore the dir or fix the entry",
)
def index_entry_deleted_beside_a_stamped_dir(tmp_path: Path) -> None:
    run = first_run(tmp_path)
    stamped_dir(tmp_path / "root", "k")
    shutil.rmtree(run)
    with pytest.raises(RunDirError, match="which does not exist"):
        relaunch(tmp_path, tmp_path / "root")


@case(
    "`run_meta.json` with fields this version does not know (written by a newer version)",
    "ignored: the run is resumed",
)
def run_meta_with_unknown_fields(tmp_path: Path) -> None:
    run = first_run(tmp_path)
    meta = json.loads((run / layout.RUN_META).read_text())
    (run / layout.RUN_META).write_text(json.dumps({**meta, "future": {"x": 1}}))
    again, started = relaunch(tmp_path, tmp_path / "root")
    assert (again.path, started) == (run, 2)


@case(
    "`last.ckpt` in a run dir without `saves.json` (copied in by hand)",
    "the restart resumes from it and writes `saves.json`",
)
def last_checkpoint_without_record(tmp_path: Path) -> None:
    run = first_run(tmp_path)
    layout.saves_record(run).unlink()
    again, started = relaunch(tmp_path, tmp_path / "root")
    assert (again.path, started) == (run, 2)
    assert layout.saves_record(run).exists()


@case(
    "a relaunch of a finished run with the same key",
    "the run is resumed and `fit` ends at once: nothing is trained twice",
)
def relaunch_of_a_finished_run(tmp_path: Path) -> None:
    run = first_run(tmp_path)
    again, started = relaunch(tmp_path, tmp_path / "root", steps=2)
    assert (again.path, again.is_resumed, started) == (run, True, None)  # no training step started
    assert torch.load(layout.last_checkpoint(run), weights_only=True)["global_step"] == 2


@case(
    "a `.lock` whose record names a live process (or another host) but that nobody holds",
    "not in use: the kernel's lock decides, not the record; the launch trains",
)
def stale_lock_record(tmp_path: Path) -> None:
    run = first_run(tmp_path)
    for record in ({"pid": 1, "host": socket.gethostname()}, {"pid": 1, "host": "elsewhere"}):
        (run / layout.LOCK).write_text(json.dumps(record))
        again, _ = relaunch(tmp_path, tmp_path / "root", steps=2)
        assert again.path == run


@case(
    "a `.lock` that is a folder",
    "`RunDirError` in one line naming the run dir, not a traceback",
)
def lock_is_a_folder(tmp_path: Path) -> None:
    run = first_run(tmp_path)
    (run / layout.LOCK).unlink()
    (run / layout.LOCK).mkdir()
    PROCESS.reset()
    with pytest.raises(RunDirError, match="Cannot take the lock of run dir") as refused:
        RunDir(root=tmp_path / "root", key="k")
    assert one_line(str(refused.value))


@case(
    "a read-only runs root at restart",
    "`RunDirError` in one line: remount it read-write, or copy the root to a writable place",
)
@needs_mounts
def read_only_root_at_restart(tmp_path: Path) -> None:
    first_run(tmp_path)
    result = under_read_only_mount(tmp_path, tmp_path / "root", _REFUSAL.format(root=str(tmp_path / "root")))
    assert result.stdout.startswith("ERROR Cannot take the lock of run dir"), result.stdout + result.stderr
    assert "Read-only file system" in result.stdout and "Remount it read-write" in result.stdout
    assert len(result.stdout.strip().splitlines()) == 1 and "Traceback" not in result.stderr


@case(
    "a restart by another user (the run dir belongs to someone else: `EACCES`)",
    "`RunDirError` in one line naming both users: restart as the run's owner or give access",
)
@needs_permissions
def restart_by_another_user(tmp_path: Path) -> None:
    run = first_run(tmp_path)
    (run / layout.LOCK).chmod(0o644)
    for path in (run, *run.rglob("*")):
        os.chown(path, 12345, 12345)
    result = script(tmp_path, _REFUSAL.format(root=str(tmp_path / "root")), *permission_prefix() or ())
    assert result.stdout.startswith("ERROR Cannot take the lock of run dir"), result.stdout + result.stderr
    assert "Permission denied" in result.stdout and "belongs to uid 12345" in result.stdout
    assert len(result.stdout.strip().splitlines()) == 1 and "Traceback" not in result.stderr


_LINGERING_JOB = """
import os, signal, sys, threading, time
import lightning.pytorch as pl
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
from torch.utils.data import DataLoader, Dataset
from lightning_resume import RequeueCheckpoint, RunDir

class Data(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((32,), float(i))

def linger(worker_id):
    # A worker slow to die: a thread of its own keeps it alive for a while after its trainer is gone.
    threading.Thread(target=time.sleep, args=(60,)).start()

class Kill(pl.Callback):
    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # the trainer alone, as the OOM killer does

root, kill_at = sys.argv[1], int(sys.argv[2])
run_dir = RunDir(root=root, key="k")
trainer = pl.Trainer(max_steps=6, max_epochs=1, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, default_root_dir=root,
                     callbacks=[Kill(), run_dir, RequeueCheckpoint(every_n_train_steps=2)])
loader = DataLoader(Data(), batch_size=4, num_workers=2, worker_init_fn=linger if kill_at > 0 else None)
trainer.fit(BoringModel(), train_dataloaders=loader)
print("RESUMED", run_dir.is_resumed, "STEP", trainer.global_step)
"""


@case(
    "the trainer SIGKILLed alone (the OOM killer) while its data-loader workers live on for a while",
    "an immediate relaunch resumes: forked workers never hold the run-dir lock",
)
def orphaned_workers(tmp_path: Path) -> None:
    job, root = tmp_path / "job.py", tmp_path / "root"
    job.write_text(_LINGERING_JOB)
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(
            [sys.executable, str(job), str(root), "5"],
            stdout=log,
            stderr=log,
            env=job_env(),
            start_new_session=True,
        )
    try:
        assert first.wait(timeout=180) == -signal.SIGKILL, (tmp_path / "first.log").read_text()
        os.killpg(first.pid, 0)  # its workers are still alive: the relaunch is immediate
        again = subprocess.run(
            [sys.executable, str(job), str(root), "0"],
            capture_output=True,
            text=True,
            env=job_env(),
            timeout=180,
        )
        assert "RESUMED True STEP 6" in again.stdout, again.stdout + again.stderr
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)


@case(
    "the run-dir lock held by a leftover of a dead attempt that got the descriptor without a fork "
    "(passed on, or a fork without Python's hooks)",
    "stale: the recorded owner is a dead process of this machine, so the lock is taken over, "
    "with one log line",
)
def lock_held_by_a_leftover(tmp_path: Path) -> None:
    run = first_run(tmp_path)
    holder = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import os, subprocess
                from lightning_resume import RunDir
                run = RunDir(root={str(tmp_path / "root")!r}, key="k")
                def target(fd):
                    try:
                        return os.readlink(f"/proc/self/fd/{{fd}}")
                    except OSError:  # the descriptor listdir used
                        return None
                path = {str(run / layout.LOCK)!r}
                lock = next(int(fd) for fd in os.listdir("/proc/self/fd") if target(fd) == path)
                leftover = subprocess.Popen(["sleep", "60"], pass_fds=[lock], start_new_session=True,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                print(leftover.pid)
                """
            ),
        ],
        capture_output=True,
        text=True,
        env=job_env(),
        timeout=120,
    )
    assert holder.returncode == 0, holder.stderr
    leftover = int(holder.stdout.split()[-1])  # the holder has exited; its leftover holds the lock
    try:
        with LogLines() as lines:
            again, started = relaunch(tmp_path, tmp_path / "root")
        assert (again.path, started) == (run, 2)
        assert len([line for line in lines if "held by a leftover of a dead attempt" in line]) == 1, lines
    finally:
        os.kill(leftover, signal.SIGKILL)


#: Rounds of each race in the default run.
ROUNDS = 8


class Racers:
    """Launch processes kept alive between rounds (importing Lightning once each)."""

    def __init__(self, count: int, log: Path) -> None:
        self.log = log
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "jobs.launch_racer"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=open(log, "a"),  # noqa: SIM115 - the process owns it
                text=True,
                env=job_env(),
            )
            for _ in range(count)
        ]

    def ask(self, proc: subprocess.Popen[str], command: dict[str, object]) -> dict[str, object]:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(command) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line, f"a racer died: {self.log.read_text()[-3000:]}"
        return dict(json.loads(line))

    def launch(self, root: Path, envs: list[dict[str, str]], first: int = 0) -> list[dict[str, object]]:
        """Start ``len(envs)`` launches (racers ``first``, ``first + 1``, ...) under ``root`` at the same
        moment; return what each decided."""
        barrier = root.parent / f".barrier-{root.name}"
        procs = self.procs[first : first + len(envs)]
        with open(barrier, "w") as gate:
            fcntl.flock(gate, fcntl.LOCK_EX)
            for proc, env in zip(procs, envs, strict=True):
                assert "ready" in self.ask(proc, {"root": str(root), "env": env, "barrier": str(barrier)})
            time.sleep(0.05)  # every racer is blocked on the barrier now
            fcntl.flock(gate, fcntl.LOCK_UN)
        answers = []
        for proc in procs:
            assert proc.stdout is not None
            answers.append(dict(json.loads(proc.stdout.readline())))
        return answers

    def fit(self, index: int) -> int:
        return int(self.ask(self.procs[index], {"fit": True})["step"])  # type: ignore[call-overload]

    def release(self, count: int) -> None:
        for proc in self.procs[:count]:
            assert "released" in self.ask(proc, {"release": True})

    def close(self) -> None:
        for proc in self.procs:
            if proc.stdin is not None:
                proc.stdin.close()
        for proc in self.procs:
            proc.wait(timeout=60)


_RACERS: list[Racers] = []


def racers(tmp_path: Path) -> Racers:
    """This test process's racers, started on first use (and ended with it)."""
    if not _RACERS:
        _RACERS.append(Racers(3, tmp_path.parent / "racers.log"))
        atexit.register(_RACERS[0].close)
    return _RACERS[0]


def one_trains(root: Path, answers: list[dict[str, object]], key: str) -> int:
    """Check that exactly one launch trains (in the key's only run dir), the others are refused in one
    line naming the live one; return the index of the one that trains."""
    winners = [i for i, a in enumerate(answers) if "trains" in a]
    assert len(winners) == 1, answers
    run = Path(str(answers[winners[0]]["trains"]))
    for refused in (str(a["refused"]) for a in answers if "refused" in a):
        assert one_line(refused) and "in use by another live attempt" in refused, refused
    assert sorted(root.glob(layout.RUN_GLOB)) == [run], "an orphan run dir was left"
    assert read_index(root, key) == run
    return winners[0]


def race(tmp_path: Path, launches: int, rounds: int, lost_index: bool = False) -> None:
    """``launches`` launches of one explicit key at the same moment, ``rounds`` times."""
    pool = racers(tmp_path)
    for n in range(rounds):
        root = tmp_path / f"round{n}"
        orphan = stamped_dir(root, "k") if lost_index else None
        answers = pool.launch(root, [{"LIGHTNING_RESUME_KEY": "k"}] * launches)
        winner = one_trains(root, answers, "k")
        if orphan is not None:
            assert answers[winner]["trains"] == str(orphan)
        if n == 0:
            assert pool.fit(winner) == 2
        pool.release(launches)


@case(
    "two launches of one explicit key at the same moment (a double submit, a job array with a fixed key)",
    "one trains; the other gets `RunDirError` in one line naming the live one; no second run dir",
)
def two_launches_at_once(tmp_path: Path) -> None:
    race(tmp_path, 2, ROUNDS)


@case(
    "three launches of one explicit key at the same moment",
    "one trains; the two others get `RunDirError` in one line; no other run dir",
)
def three_launches_at_once(tmp_path: Path) -> None:
    race(tmp_path, 3, ROUNDS)


@case(
    "launches of one key at the same moment while its index entry is lost (one run dir stamped with it)",
    "one resumes the stamped dir and records it again; the others get `RunDirError`; no new run dir",
)
def launches_at_once_with_a_lost_index(tmp_path: Path) -> None:
    race(tmp_path, 3, ROUNDS, lost_index=True)


@case(
    "launches of different keys at the same moment under one root",
    "each trains in its own run dir, recorded under its own key",
)
def different_keys_at_once(tmp_path: Path) -> None:
    pool = racers(tmp_path)
    for n in range(ROUNDS):
        root = tmp_path / f"round{n}"
        answers = pool.launch(root, [{"LIGHTNING_RESUME_KEY": k} for k in "abc"])
        runs = [Path(str(a["trains"])) for a in answers]
        assert [read_index(root, k) for k in "abc"] == runs and len(set(runs)) == 3, answers
        pool.release(3)


@case(
    "two SLURM steps of one job started at the same moment (no explicit key, no restart count)",
    "both train, each in its own run dir; the index names one of them, as for a rerun inside one allocation",
)
def slurm_steps_at_once(tmp_path: Path) -> None:
    pool = racers(tmp_path)
    for n in range(ROUNDS):
        root = tmp_path / f"round{n}"
        answers = pool.launch(root, [{"SLURM_JOB_ID": "31"}] * 2)
        runs = sorted(Path(str(a["trains"])) for a in answers)
        assert len(set(runs)) == 2 and read_index(root, "31") in runs, answers
        assert sorted(root.glob(layout.RUN_GLOB)) == runs
        pool.release(2)


@case(
    "two restarts of one SLURM job at the same moment (a requeue racing a manual relaunch)",
    "one resumes the run; the other gets `RunDirError` in one line",
)
def slurm_restarts_at_once(tmp_path: Path) -> None:
    pool = racers(tmp_path)
    for n in range(ROUNDS):
        root = tmp_path / f"round{n}"
        first = resolve(root, read_session({"SLURM_JOB_ID": "32"}))
        answers = pool.launch(root, [{"SLURM_JOB_ID": "32", "SLURM_RESTART_COUNT": "1"}] * 2)
        winner = one_trains(root, answers, "32")
        assert answers[winner]["trains"] == str(first.path)
        pool.release(2)


@case(
    "a relaunch while the key's run is live and its index entry was deleted meanwhile",
    "`RunDirError` naming the live attempt (found by its key); nothing is created",
)
def live_run_with_a_deleted_index(tmp_path: Path) -> None:
    pool, root = racers(tmp_path), tmp_path / "root"
    (first,) = pool.launch(root, [{"LIGHTNING_RESUME_KEY": "k"}])
    index_path(root, "k").unlink()
    (second,) = pool.launch(root, [{"LIGHTNING_RESUME_KEY": "k"}], first=1)
    assert "in use by another live attempt" in str(second.get("refused")), second
    assert sorted(root.glob(layout.RUN_GLOB)) == [Path(str(first["trains"]))]
    pool.release(2)


#: Rounds of each race in the slow run.
MANY_ROUNDS = 300


@pytest.mark.slow
@pytest.mark.parametrize(("launches", "lost_index"), [(2, False), (3, False), (3, True)])
def test_launches_race_many_times(tmp_path: Path, launches: int, lost_index: bool) -> None:
    race(tmp_path, launches, MANY_ROUNDS, lost_index)


@case(
    "a launch while the first launch of its key has created its run dir but not yet recorded it",
    "`RunDirError` naming the live first launch: the run dir is locked before it is stamped",
)
def launch_between_run_dir_and_index(tmp_path: Path) -> None:
    root = tmp_path / "root"
    code = (
        "from pathlib import Path; from lightning_resume.run_dir.resolve import create_run; "
        "from lightning_resume._scheduler.environment import read_session; "
        f"create_run(Path({str(root)!r}), read_session({{}}, 'k'))"
    )
    with live_holder(code) as holder:
        with pytest.raises(RunDirError, match=f"in use by another live attempt .pid {holder.pid} on"):
            RunDir(root=root, key="k")
        assert len(layout.run_dirs(root)) == 1


@case(
    "a relaunch after the first attempt died between creating its run dir and recording it",
    "that run dir is found by its key and used (it starts from the beginning there); no second run dir",
)
def first_attempt_died_before_its_index(tmp_path: Path) -> None:
    orphan = stamped_dir(tmp_path / "root", "k")
    again, started = relaunch(tmp_path, tmp_path / "root", steps=2)
    assert (again.path, started) == (orphan, 0)
    assert layout.run_dirs(tmp_path / "root") == [orphan]


@case(
    "a relaunch after the first attempt died before writing `run_meta.json` (a run-dir-shaped folder "
    "holding only `.lock`)",
    "not a run dir: ignored; the relaunch starts a fresh run beside it",
)
def first_attempt_died_before_its_run_meta(tmp_path: Path) -> None:
    half = tmp_path / "root" / "20260101" / "120000" / "0123456789ab"
    half.mkdir(parents=True)
    (half / layout.LOCK).touch()
    again, started = relaunch(tmp_path, tmp_path / "root", steps=2)
    assert again.path != half and started == 0 and layout.run_dirs(tmp_path / "root") == [again.path]


@case(
    "files in `.handoff` left by an earlier launch with the same launch key (an answer to another "
    "request, an earlier version's single file), or holding garbage",
    "ignored: a waiting rank never adopts them; it waits for this launch's rank 0 (`RunDirError` on timeout)",
)
def stale_handoff(tmp_path: Path) -> None:
    root = tmp_path / "root"
    env = {"SLURM_JOB_ID": "40", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}
    os.environ.update(env)
    earlier = json.loads(resolve(root, read_session({"SLURM_JOB_ID": "40"})).to_json())
    folder = root / layout.HANDOFF_DIR
    folder.mkdir()
    launch = key_filename(launch_key(env) or "")
    (folder / f"{launch}.0a1b.answer").write_text(json.dumps({**earlier, "written": time.time()}))
    (folder / launch).write_text(json.dumps({**earlier, "written": time.time()}))
    (folder / f"{launch}.2c3d.answer").write_text("{garbage")
    with pytest.raises(RunDirError, match="did not publish its run dir"):
        RunDir(root=root, handoff_timeout=0.3)


@case(
    "`PreemptionHandler` without `RequeueCheckpoint`, or `RequeueCheckpoint` without `RunDir`",
    "`MissingCallbackError` (a `ValueError`) at `setup`, naming what to add",
)
def missing_callbacks(tmp_path: Path) -> None:
    with pytest.raises(MissingCallbackError, match="add RequeueCheckpoint"):
        fit(tmp_path, RunDir(root=tmp_path / "root"), PreemptionHandler())
    with pytest.raises(MissingCallbackError, match="needs exactly one RunDir"):
        fit(tmp_path, RequeueCheckpoint())


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


@pytest.mark.parametrize("entry", cases_of(__name__), ids=lambda c: c.name)
def test_catalogue(entry: Case, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    run_case(entry, tmp_path, request)
