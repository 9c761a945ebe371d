"""The real ``lightning-resume`` console script against run dirs made by real training runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import job_env, run_job

SCRIPT = str(Path(sys.executable).parent / "lightning-resume")


def cli(*args: str | Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCRIPT, *map(str, args)], env=job_env(**env), capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A runs root with a finished run and a preempted (SIGKILLed) one."""
    root = tmp_path_factory.mktemp("cli") / "root"
    done = run_job(root, root.parent / "a.pt", "--epochs", "1", LIGHTNING_RESUME_KEY="finished-job")
    assert done.returncode == 0, done.output
    killed = run_job(root, root.parent / "b.pt", "--kill-at", "5", SLURM_JOB_ID="4711")
    assert killed.returncode == -9, killed.output
    return root


def test_doctor_reports_each_check_and_fails_on_errors(tmp_path: Path) -> None:
    ok = cli("doctor", "--root", tmp_path, "--json", WANDB_MODE="offline", SWANLAB_MODE="offline")
    assert ok.returncode == 0, ok.stderr
    findings = json.loads(ok.stdout)
    assert {f["check"] for f in findings} >= {"scheduler", "session key", "TMPDIR", "free space", "wandb"}
    assert all(f["level"] in ("ok", "warn", "error") for f in findings)
    # Under SLURM with no scontrol on PATH a requeue cannot be issued: an error, exit status 1.
    bad = cli("doctor", "--root", tmp_path, "--json", SLURM_JOB_ID="1", PATH=str(tmp_path))
    assert bad.returncode == 1
    assert any(f["check"] == "scontrol" and f["level"] == "error" for f in json.loads(bad.stdout))


def test_doctor_times_durable_writes_to_the_root_and_the_largest_checkpoint(runs: Path) -> None:
    out = cli("doctor", "--root", runs, "--json", "--write-test", "8")
    assert out.returncode == 0, out.stderr
    (speed,) = [f for f in json.loads(out.stdout) if f["check"] == "write speed"]
    assert speed["level"] == "ok" and "MB/s durable writes to" in speed["detail"]
    assert "the largest checkpoint" in speed["detail"]
    assert not [p for p in runs.iterdir() if p.name.startswith(".lr-tmp-")]
    skipped = cli("doctor", "--root", runs, "--json", "--write-test", "0")
    assert "write speed" not in {f["check"] for f in json.loads(skipped.stdout)}


def test_doctor_table_on_a_terminal_like_output(tmp_path: Path) -> None:
    out = cli("doctor", "--root", tmp_path, WANDB_MODE="online")
    assert "lightning-resume doctor" in out.stdout and "WANDB_MODE is online" in out.stdout


def test_gc_is_a_dry_run_by_default_and_spares_unfinished_runs(runs: Path) -> None:
    index = sorted(p.name for p in (runs / ".index").iterdir())
    assert index == ["4711", "finished-job"]
    dry = cli("gc", runs, "--older-than", "0s", "--json")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert plan["applied"] is False
    assert [Path(r["path"]).name for r in plan["removals"]] == ["finished-job"]
    assert sorted(p.name for p in (runs / ".index").iterdir()) == index
    young = json.loads(cli("gc", runs, "--older-than", "30d", "--json").stdout)
    assert young["removals"] == []


def test_gc_apply_removes_only_what_it_listed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    assert run_job(root, tmp_path / "a.pt", "--epochs", "1", LIGHTNING_RESUME_KEY="k").returncode == 0
    handoff = root / ".handoff" / "old-launch"
    handoff.parent.mkdir()
    handoff.write_text("{}")
    old = time.time() - 3 * 86400
    os.utime(handoff, (old, old))
    applied = json.loads(cli("gc", root, "--older-than", "1d", "--apply", "--json").stdout)
    assert [r["kind"] for r in applied["removals"]] == ["handoff"]
    assert not handoff.exists() and (root / ".index" / "k").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("gc", "/no/such/root"), "is not a directory"),
        (("gc", ".", "--older-than", "soon"), "expected an age"),
        (("doctor", "--bogus"), "unrecognized arguments"),
        (("nope",), "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_status_2(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    out = cli(*args)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


RUN_SCHEMA = {
    "type": "object",
    "required": [
        "kind",
        "path",
        "run_id",
        "session_key",
        "status",
        "checkpoints",
        "next_restart_loads",
        "index_entries",
        "sidecars",
    ],
    "properties": {
        "kind": {"const": "run"},
        "status": {"type": "object", "required": ["status"]},
        "checkpoints": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "size", "step", "result"],
                "properties": {
                    "result": {
                        "enum": ["verified", "corrupt", "loads", "loads (manifest unreadable)", "unreadable"]
                    }
                },
            },
        },
        "next_restart_loads": {"type": "object", "required": ["checkpoint", "why"]},
        "index_entries": {"type": "array", "items": {"type": "string"}},
        "sidecars": {"type": "array"},
    },
}
ROOT_SCHEMA = {
    "type": "object",
    "required": ["kind", "root", "runs", "index", "handoff_files"],
    "properties": {
        "kind": {"const": "root"},
        "runs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": [
                    "path",
                    "run_id",
                    "session_key",
                    "status",
                    "last_step",
                    "age_seconds",
                    "indexed",
                    "orphan",
                ],
            },
        },
        "index": {"type": "array", "items": {"type": "object", "required": ["key", "target", "state"]}},
    },
}


def test_inspect_root_lists_runs_index_and_status(runs: Path) -> None:
    import jsonschema

    out = cli("inspect", runs, "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    jsonschema.validate(report, ROOT_SCHEMA)
    by_key = {r["session_key"]: r for r in report["runs"]}
    assert by_key["finished-job"]["status"] == "finished" and by_key["finished-job"]["last_step"] == 12
    assert by_key["4711"]["status"] == "running" and by_key["4711"]["last_step"] == 4
    assert {e["key"]: e["state"] for e in report["index"]} == {"4711": "ok", "finished-job": "ok"}
    table = cli("inspect", runs)
    assert "finished-job" in table.stdout and "session index" in table.stdout


def test_inspect_run_says_what_the_next_restart_loads(runs: Path) -> None:
    import jsonschema

    run_dir = next(
        Path(r["path"])
        for r in json.loads(cli("inspect", runs, "--json").stdout)["runs"]
        if r["session_key"] == "4711"
    )
    report = json.loads(cli("inspect", run_dir, "--json").stdout)
    jsonschema.validate(report, RUN_SCHEMA)
    assert report["next_restart_loads"]["checkpoint"] == "last.ckpt"
    assert report["index_entries"] == ["4711"]
    assert report["checkpoints"][0]["step"] == 4


def test_inspect_flags_a_torn_last_ckpt(tmp_path: Path) -> None:
    root = tmp_path / "root"
    assert run_job(root, tmp_path / "a.pt", "--epochs", "1", LIGHTNING_RESUME_KEY="torn").returncode == 0
    run_dir = next(root.glob("[0-9]*/[0-9]*/*"))
    last = run_dir / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    report = json.loads(cli("inspect", run_dir, "--json").stdout)
    assert report["checkpoints"][0]["result"] == "unreadable"
    assert report["next_restart_loads"]["checkpoint"] is None
    assert "no older checkpoint is verified" in report["next_restart_loads"]["why"]


def test_inspect_rejects_what_is_not_a_run_or_root(tmp_path: Path) -> None:
    for path, message in ((tmp_path / "missing", "does not exist"), (tmp_path, "neither a run dir")):
        out = cli("inspect", path)
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr
