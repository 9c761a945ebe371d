"""Preemption notices: fake metadata servers on 127.0.0.1 tell real jobs that the machine is going away.

Each cloud's server speaks its provider's protocol (IMDSv2 tokens, ``Metadata-Flavor: Google``,
Azure's Scheduled Events for several machines) and answers "no notice" until the job announces one at
a chosen step (a POST to ``/announce``), as the provider would. The jobs save at the same step on
every rank, train on, get the SIGTERM, and resume bitwise-exactly. Broken endpoints (slow, absent,
404, garbage) leave training untouched with at most one warning per source.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from _polls import Polls, wait_for
from conftest import job_env, run_job, same_weights, tiny_trainer, uninterrupted
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.strategies import DDPStrategy

from lightning_resume import (
    LightningResumeWarning,
    PreemptionHandler,
    RequeueCheckpoint,
    RunDir,
    _collectives,
)
from lightning_resume._scheduler.machine import on_aws, on_azure, on_gce, read_machine
from lightning_resume.notices import (
    AwsSpotNotice,
    AzureNotice,
    FileNotice,
    GceNotice,
    Notice,
    Notices,
    NoticeSource,
    SlurmTimeLimitNotice,
)
from lightning_resume.preemption.notices._aws_spot_notice import parse_instance_action
from lightning_resume.preemption.notices._azure_notice import parse_scheduled_events
from lightning_resume.preemption.notices._gce_notice import parse_maintenance_event, parse_preempted
from lightning_resume.preemption.notices._notice import format_time, parse_deadline
from lightning_resume.preemption.notices._policy import DEFAULT_SECONDS_TO_DURABLE, Act, decide
from lightning_resume.preemption.notices._poller import NoticePoller
from lightning_resume.preemption.notices._slurm_time_limit_notice import (
    parse_end_time_variable,
    parse_scontrol_end_time,
)

EXIT = 143
VM = "vm-1"


# -- fake metadata servers -------------------------------------------------------------------------


class FakeMetadata:
    """One cloud's metadata server on 127.0.0.1 (``cloud``: aws, gce, azure), or a broken one
    (``mode``: slow, 404, garbage). A POST to ``/announce`` schedules the interruption ``deadline_in``
    seconds later."""

    def __init__(self, cloud: str, mode: str = "ok", deadline_in: float = 120.0) -> None:
        self.cloud, self.mode, self.deadline_in = cloud, mode, deadline_in
        self.announced: float | None = None
        self.requests: list[str] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def deadline(self) -> float:
        assert self.announced is not None
        return self.announced + self.deadline_in

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, method: str, path: str, headers: Any) -> tuple[int, str]:
        self.requests.append(f"{method} {path}")
        if method == "POST" and path == "/announce":
            self.announced = time.time()
            return 200, "announced"
        if self.mode == "slow":
            time.sleep(1.5)
        if self.mode == "404":
            return 404, "Not Found"
        if self.mode == "garbage":
            return 200, "<html>captive portal</html>"
        return getattr(self, f"_{self.cloud}")(method, path, headers)

    def _aws(self, method: str, path: str, headers: Any) -> tuple[int, str]:
        if method == "PUT" and path == "/latest/api/token":
            ttl = headers.get("X-aws-ec2-metadata-token-ttl-seconds")
            return (200, "token-1") if ttl and 0 < int(ttl) <= 21600 else (400, "missing TTL")
        if path == "/latest/meta-data/spot/instance-action":
            if headers.get("X-aws-ec2-metadata-token") != "token-1":
                return 401, "Unauthorized"  # IMDSv2 only: no answer without the session token
            if self.announced is None:
                return 404, "Not Found"
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.deadline))
            return 200, json.dumps({"action": "terminate", "time": when})
        return 404, "Not Found"

    def _gce(self, method: str, path: str, headers: Any) -> tuple[int, str]:
        if headers.get("Metadata-Flavor") != "Google":
            return 403, "Missing Metadata-Flavor:Google header"
        if path == "/computeMetadata/v1/instance/preempted":
            return 200, "TRUE" if self.announced is not None else "FALSE"
        if path == "/computeMetadata/v1/instance/maintenance-event":
            return 200, "NONE"
        return 404, "Not Found"

    def _azure(self, method: str, path: str, headers: Any) -> tuple[int, str]:
        if headers.get("Metadata") != "true":
            return 400, "Bad request: Metadata header required"
        if path.startswith("/metadata/instance/compute/name?"):
            return 200, VM
        if path == "/metadata/scheduledevents?api-version=2020-07-01":
            # Another machine of the scale set is always being preempted: not this one's notice.
            events = [azure_event("other-vm", "Preempt", time.time() + 30)]
            if self.announced is not None:
                events.append(azure_event(VM, "Preempt", self.deadline))
            return 200, json.dumps({"DocumentIncarnation": len(events), "Events": events})
        return 404, "Not Found"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self) -> None:
                status, body = fake.answer(self.command, self.path, self.headers)
                data = body.encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (a time-out): nothing to answer

            do_GET = do_PUT = do_POST = _reply

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


def azure_event(vm: str, kind: str, not_before: float) -> dict[str, Any]:
    return {
        "EventId": f"{vm}-{kind}",
        "EventType": kind,
        "ResourceType": "VirtualMachine",
        "Resources": [vm],
        "EventStatus": "Scheduled",
        "NotBefore": formatdate(not_before, usegmt=True),
        "Description": "Spot eviction",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


@pytest.fixture
def metadata() -> Iterator[list[FakeMetadata]]:
    """The fake servers a test starts (append to the list); all shut down at the end."""
    servers: list[FakeMetadata] = []
    yield servers
    for server in servers:
        server.close()


def closed_port() -> str:
    """A base URL where nothing listens (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def notice_save(output: str) -> tuple[int, float]:
    """Step of the save made for a notice, and its seconds before the deadline, from the log line."""
    found = re.search(
        r"last\.ckpt durable at step (\d+), [\d.]+ s after the notice and ([\d.-]+) s before", output
    )
    assert found, output[-3000:]
    return int(found.group(1)), float(found.group(2))


def saves(output: str, rank: int) -> list[int]:
    return [int(step) for step in re.findall(rf"SAVED rank={rank} step=(\d+)", output)]


# -- notices mid-run, end to end -------------------------------------------------------------------

DDP = ("--devices", "2", "--loader", "plain", "--every", "0", "--preemption")


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Final weights of the 2-rank job, uninterrupted."""
    return uninterrupted(tmp_path_factory, "notices-ddp-reference", *DDP)


@pytest.mark.slow
def test_aws_spot_notice_under_ddp_saves_on_every_rank_at_one_step_then_the_sigterm_resumes_exactly(
    tmp_path: Path, metadata: list[FakeMetadata], ddp_reference: Path
) -> None:
    aws = FakeMetadata("aws")
    metadata.append(aws)
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    first = run_job(
        root,
        out,
        *DDP,
        *("--notice", f"aws={aws.url}", "--announce-at", "3", "--announce-url", f"{aws.url}/announce"),
        *("--signal-at", "13", "--step-sleep", "0.2", "--print-saves"),
        LIGHTNING_RESUME_KEY="aws",
        timeout=240,
    )
    assert first.returncode == EXIT, first.output
    step, before_deadline = notice_save(first.output)
    assert 3 <= step < 13 and step != 6 and before_deadline > 60  # saved for the notice, then trained on
    # Every rank saved at the same steps: the notice's, the epoch end's and the SIGTERM's.
    assert saves(first.output, 0) == saves(first.output, 1) == sorted({step, 6, 12, 14}), first.output
    assert "Preempted by SIGTERM at step 14" in first.output
    assert f"notice aws-spot (terminate, deadline {format_time(aws.deadline)})" in first.output
    assert f", {14 - step} steps gained after it" in first.output
    assert (
        "GET /latest/meta-data/spot/instance-action" in aws.requests
        and "PUT /latest/api/token" in aws.requests
    )
    again = run_job(root, out, *DDP, LIGHTNING_RESUME_KEY="aws", timeout=240)
    assert again.returncode == 0, again.output
    assert same_weights(out, ddp_reference)


def test_gce_preemption_notice_saves_trains_on_and_the_sigterm_resumes_exactly(
    tmp_path: Path, metadata: list[FakeMetadata], baseline: dict[str, Path]
) -> None:
    gce = FakeMetadata("gce")
    metadata.append(gce)
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    first = run_job(
        root,
        out,
        *("--preemption", "--durable", "--notice", f"gce={gce.url}"),
        *("--announce-at", "5", "--announce-url", f"{gce.url}/announce", "--signal-at", "20"),
        *("--step-sleep", "0.1", "--print-saves"),
        LIGHTNING_RESUME_KEY="gce",
    )
    assert first.returncode == EXIT, first.output
    step, before_deadline = notice_save(first.output)
    # GCE gives 30 s; with a measured time to durable of milliseconds there is room to train on.
    assert 5 <= step < 20 and 0 < before_deadline <= 30
    assert step in saves(first.output, 0) and "Preempted by SIGTERM at step 21" in first.output
    again = run_job(root, out, "--preemption", "--durable", LIGHTNING_RESUME_KEY="gce")
    assert again.returncode == 0, again.output
    assert same_weights(out, baseline["stateful"])


@pytest.mark.slow
def test_azure_preempt_event_with_on_notice_stop_stops_at_once_and_resumes_exactly(
    tmp_path: Path, metadata: list[FakeMetadata], baseline: dict[str, Path]
) -> None:
    azure = FakeMetadata("azure", deadline_in=60)
    metadata.append(azure)
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    first = run_job(
        root,
        out,
        *("--preemption", "--notice", f"azure={azure.url}", "--on-notice", "stop"),
        *("--announce-at", "8", "--announce-url", f"{azure.url}/announce", "--step-sleep", "0.1"),
        LIGHTNING_RESUME_KEY="azure",
    )
    assert first.returncode == EXIT, first.output
    stopped = re.search(
        r"Preempted by the azure notice at step (\d+): last\.ckpt durable [\d.]+ s after the stop",
        first.output,
    )
    assert stopped and 8 <= int(stopped.group(1)) < 36, first.output
    assert "notice azure (Preempt, deadline" in first.output and ", 0 steps gained after it" in first.output
    assert "fit ended by the azure notice" in first.output  # SignalDiagnostics reads the same report
    again = run_job(root, out, "--preemption", LIGHTNING_RESUME_KEY="azure")
    assert again.returncode == 0, again.output
    assert same_weights(out, baseline["stateful"])


@pytest.mark.long
def test_file_notice_with_a_deadline_trains_on_and_stops_before_it_then_resumes_exactly(
    tmp_path: Path, baseline: dict[str, Path]
) -> None:
    root, out, flag = tmp_path / "runs", tmp_path / "out.pt", tmp_path / "preempted"
    first = run_job(
        root,
        out,
        *("--preemption", "--durable", "--notice", f"file={flag}", "--notice-margin", "1"),
        *("--announce-at", "4", "--announce-file", str(flag), "--announce-deadline", "6"),
        *("--step-sleep", "0.25"),
        LIGHTNING_RESUME_KEY="file",
    )
    assert first.returncode == EXIT, first.output
    step, before_deadline = notice_save(first.output)
    stopped = re.search(r"Preempted by the file notice at step (\d+)", first.output)
    assert stopped, first.output
    gained = int(stopped.group(1)) - step
    assert step >= 4 and gained > 0 and before_deadline > 0
    assert f", {gained} steps gained after it" in first.output
    final = re.search(r"the last save durable ([\d.-]+) s before the deadline", first.output)
    assert final and float(final.group(1)) > 0, first.output
    again = run_job(root, out, "--preemption", "--durable", LIGHTNING_RESUME_KEY="file")
    assert again.returncode == 0, again.output
    assert same_weights(out, baseline["stateful"])


@pytest.mark.slow
def test_a_deadline_too_close_for_two_saves_stops_at_once(
    tmp_path: Path, metadata: list[FakeMetadata], baseline: dict[str, Path]
) -> None:
    """20 s of warning and no save measured yet (30 s assumed): no room to save and train on."""
    aws = FakeMetadata("aws", deadline_in=20)
    metadata.append(aws)
    root, out = tmp_path / "runs", tmp_path / "out.pt"
    first = run_job(
        root,
        out,
        *("--preemption", "--notice", f"aws={aws.url}", "--announce-at", "5"),
        *("--announce-url", f"{aws.url}/announce", "--step-sleep", "0.1"),
        LIGHTNING_RESUME_KEY="close",
    )
    assert first.returncode == EXIT, first.output
    assert "Preemption notice from" not in first.output  # no save to train on after
    assert re.search(
        r"Preempted by the aws-spot notice at step \d+: .*, 0 steps gained after it", first.output
    )
    again = run_job(root, out, "--preemption", LIGHTNING_RESUME_KEY="close")
    assert again.returncode == 0, again.output
    assert same_weights(out, baseline["stateful"])


# Validation after step 6 and at the epoch end, 200 batches of 0.05 s each (as test_validation_signals).
SLOW_VALIDATION = (
    *("--loader", "plain", "--epochs", "1", "--every", "4", "--preemption", "--sanity", "0"),
    *("--val-samples", "200", "--val-batch-size", "1", "--val-sleep", "0.05", "--val-check-interval", "6"),
)


@pytest.mark.slow
def test_a_notice_to_stop_during_validation_stops_it_and_the_restart_redoes_it_exactly(
    tmp_path: Path,
) -> None:
    ref = run_job(tmp_path / "ref", tmp_path / "ref.pt", *SLOW_VALIDATION, timeout=600)
    assert ref.returncode == 0, ref.output
    root, out, flag = tmp_path / "runs", tmp_path / "out.pt", tmp_path / "preempted"
    notice = ("--notice", f"file={flag}", "--on-notice", "stop", "--announce-file", str(flag))
    notice += ("--announce-at", "6", "--announce-val-batch", "50")  # in the validation after step 6
    first = run_job(root, out, *SLOW_VALIDATION, *notice, LIGHTNING_RESUME_KEY="val", timeout=600)
    assert first.returncode == EXIT, first.output
    assert "Preempted by the file notice at step 6" in first.output, first.output
    assert "VAL_DONE sanity=False step=6" not in first.output  # validation was cut short
    again = run_job(root, out, *SLOW_VALIDATION, LIGHTNING_RESUME_KEY="val", timeout=600)
    assert again.returncode == 0, again.output
    assert "VAL_DONE sanity=False step=6 batches=200" in again.output  # and done again in full
    assert same_weights(out, tmp_path / "ref.pt")


# -- broken endpoints ------------------------------------------------------------------------------


class WaitForWarnings(pl.Callback):
    """Hold training at its first batch until ``count`` warnings were given, then until every source was
    polled twice more (bounded): the poller met the broken endpoints while training ran, and went on
    polling them after its warning (polls that must not warn again)."""

    def __init__(self, caught: list[warnings.WarningMessage], count: int, polls: list[Polls]) -> None:
        self.caught, self.count, self.polls = caught, count, polls

    def on_train_batch_end(self, *args: Any) -> None:
        if wait_for(lambda: len(ours(self.caught)) >= self.count, 15):
            for polls in self.polls:
                polls.more(2, 15)


def ours(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, LightningResumeWarning)]


def fit_boring(tmp_path: Path, *callbacks: pl.Callback) -> dict[str, torch.Tensor]:
    pl.seed_everything(7)
    trainer = tiny_trainer(
        RunDir(root=tmp_path / "runs"),
        RequeueCheckpoint(),
        *callbacks,
        tmp_path=tmp_path,
        limit_train_batches=6,
    )
    model = BoringModel()
    trainer.fit(model)
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("mode", ["slow", "absent", "404", "garbage"])
def test_a_broken_endpoint_leaves_training_unaffected_with_one_warning_per_source(
    tmp_path: Path, mode: str, metadata: list[FakeMetadata]
) -> None:
    reference = fit_boring(tmp_path / "ref", PreemptionHandler(notices=None))
    urls = {}
    for cloud in ("aws", "gce", "azure"):
        if mode == "absent":
            urls[cloud] = closed_port()
        else:
            metadata.append(FakeMetadata(cloud, mode))
            urls[cloud] = metadata[-1].url
    sources: list[NoticeSource] = [
        AwsSpotNotice(endpoint=urls["aws"], interval=0.01, timeout=0.3),
        GceNotice(endpoint=urls["gce"], interval=0.01, timeout=0.3),
        AzureNotice(endpoint=urls["azure"], interval=0.01, timeout=0.3),
    ]
    polls = [Polls(source) for source in sources]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wait = WaitForWarnings(caught, 3, polls)
        weights = fit_boring(tmp_path / "run", wait, PreemptionHandler(notices=Notices(sources)))
    found = ours(caught)
    assert sorted(m.split(" at ")[0] for m in found) == [
        "Preemption notices from aws-spot",
        "Preemption notices from azure",
        "Preemption notices from gce",
    ], found
    expected = {
        "slow": "no answer within 0.3 s",
        "absent": "connection refused",
        "404": "answered HTTP 404",
        "garbage": "unexpected",
    }
    assert all(expected[mode] in m and "(3 polls in a row)" in m for m in found), found
    assert all(p.count >= 5 for p in polls), [p.count for p in polls]  # polled on after the warning
    assert all(len(server.requests) > 3 for server in metadata)
    assert all(torch.equal(weights[k], reference[k]) for k in reference)
    # The poller ends with fit (it is given up to one time-out to notice).
    deadline = time.monotonic() + 5
    while (
        any(t.name == "lightning-resume-notices" for t in threading.enumerate())
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert not any(t.name == "lightning-resume-notices" for t in threading.enumerate())


# -- LightningCLI and Hydra ------------------------------------------------------------------------

CLI_SCRIPT = """
import os
import threading
import lightning.pytorch as pl
from lightning.pytorch.cli import LightningCLI
from jobs.train_job import Model, Noisy, loader
from lightning_resume import PreemptionHandler

class Data(pl.LightningDataModule):
    def train_dataloader(self):
        return loader("stateful", Noisy(), 8, shuffle=True)

class CLIModel(Model):
    def on_train_start(self):
        # The sign that the poller read the notice: the file source the YAML built returned one.
        (handler,) = [c for c in self.trainer.callbacks if isinstance(c, PreemptionHandler)]
        (source,) = handler.notices.sources
        poll, self.seen = source.poll, threading.Event()
        def seen_poll():
            found = poll()
            if found is not None:
                self.seen.set()
            return found
        source.poll = seen_poll

    def on_train_batch_end(self, *args):
        # After the handler's check at this step: the next check (step 6) finds the notice.
        if self.trainer.global_step == 5:
            open(os.environ["NOTICE_FILE"], "w").close()  # the notice: a file without a deadline
            assert self.seen.wait(120), "the poller never read the notice file"

LightningCLI(CLIModel, Data)
"""

CLI_CONFIG = """
seed_everything: 7
trainer:
  max_epochs: 2
  accelerator: cpu
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
  default_root_dir: {root}
  callbacks:
    - class_path: lightning_resume.RequeueCheckpoint
    - class_path: lightning_resume.RunDir
      init_args:
        root: {root}
    - class_path: lightning_resume.PreemptionHandler
      init_args:
        notices:
          on_notice: stop
          sources:
            - class_path: lightning_resume.notices.FileNotice
              init_args:
                path: {flag}
                interval: 0.05
"""


def test_notices_from_lightning_cli_yaml_stop_the_job_at_a_file_notice(tmp_path: Path) -> None:
    script, config = tmp_path / "cli.py", tmp_path / "config.yaml"
    script.write_text(CLI_SCRIPT)
    flag = tmp_path / "preempted"
    config.write_text(CLI_CONFIG.format(root=tmp_path / "runs", flag=flag))
    cmd = [sys.executable, str(script), "fit", "--config", str(config)]
    proc = subprocess.run(
        cmd, env=job_env(NOTICE_FILE=str(flag)), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == EXIT, proc.stderr[-3000:]
    assert "Preempted by the file notice at step 6:" in proc.stderr, proc.stderr[-3000:]


def test_lightning_cli_and_hydra_read_every_form_of_notices(tmp_path: Path) -> None:
    from hydra.utils import instantiate
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_class_arguments(PreemptionHandler, "handler")
    for text, expected in (
        ("{}", Notices()),
        ("{notices: null}", None),
        ("{notices: {sources: null}}", Notices(None)),
        ("{notices: {sources: [], on_notice: stop, margin: 5}}", Notices([], "stop", 5.0)),
        (
            "{notices: {class_path: lightning_resume.notices.Notices, init_args: {margin: 2}}}",
            Notices(margin=2),
        ),
    ):
        handler = parser.instantiate(parser.parse_string(f"handler: {text}")).handler
        assert handler.notices == expected
        handler.uninstall()
    aws = "{class_path: lightning_resume.notices.AwsSpotNotice, init_args: {endpoint: 'http://x'}}"
    handler = parser.instantiate(parser.parse_string(f"handler: {{notices: {{sources: [{aws}]}}}}")).handler
    assert [type(s) for s in handler.notices.sources] == [AwsSpotNotice]
    assert handler.notices.sources[0].base_url == "http://x"
    handler.uninstall()
    spec = {
        "_target_": "lightning_resume.PreemptionHandler",
        "notices": {
            "_target_": "lightning_resume.notices.Notices",
            "on_notice": "stop",
            "sources": [{"_target_": "lightning_resume.notices.FileNotice", "path": str(tmp_path / "f")}],
        },
    }
    handler = instantiate(spec)
    assert handler.notices.on_notice == "stop"
    assert [s.describe() for s in handler.notices.sources] == [f"file {tmp_path / 'f'}"]
    handler.uninstall()


# -- the pure parts --------------------------------------------------------------------------------


def test_provider_answers_are_parsed_into_notices() -> None:
    notice = parse_instance_action('{"action": "terminate", "time": "2026-05-01T12:00:00Z"}', received=1.0)
    assert (notice.source, notice.kind, notice.deadline) == ("aws-spot", "terminate", 1777636800.0)
    assert parse_preempted("TRUE\n") is True and parse_preempted("FALSE") is False
    assert parse_maintenance_event("TERMINATE_ON_HOST_MAINTENANCE") == "TERMINATE_ON_HOST_MAINTENANCE"
    assert parse_maintenance_event("MIGRATE_ON_HOST_MAINTENANCE") is None
    assert parse_maintenance_event("NONE") is None
    events = {
        "DocumentIncarnation": 3,
        "Events": [
            azure_event("other", "Preempt", 100.0),
            azure_event("VM-1", "Terminate", 1777636800.0),
            {**azure_event(VM, "Freeze", 50.0)},
            {**azure_event(VM, "Preempt", 0.0), "EventStatus": "Started", "NotBefore": ""},
        ],
    }
    stops = parse_scheduled_events(json.dumps(events), VM)
    assert [(s.event_type, s.not_before) for s in stops] == [("Terminate", 1777636800.0), ("Preempt", None)]
    for bad, parse in (
        ("<html>", lambda t: parse_instance_action(t, 0.0)),
        ('{"action": 1}', lambda t: parse_instance_action(t, 0.0)),
        ("maybe", parse_preempted),
        ("<html>", parse_maintenance_event),
        ('{"Events": {}}', lambda t: parse_scheduled_events(t, VM)),
        ("[]", lambda t: parse_scheduled_events(t, VM)),
    ):
        with pytest.raises(ValueError):
            parse(bad)


def test_slurm_end_time_and_file_deadlines_are_read() -> None:
    line = "JobId=7 TimeLimit=00:01:00 StartTime=2026-05-01T12:00:00 EndTime=2026-05-01T12:01:00 Deadline=N/A"
    assert parse_scontrol_end_time(line) == time.mktime((2026, 5, 1, 12, 1, 0, 0, 0, -1))
    assert parse_scontrol_end_time("JobId=7 TimeLimit=UNLIMITED EndTime=Unknown Deadline=N/A") is None
    with pytest.raises(ValueError, match="no EndTime"):
        parse_scontrol_end_time("slurm_load_jobs error: Invalid job id specified")
    assert parse_end_time_variable("1777636860") == 1777636860.0 and parse_end_time_variable("0") is None
    source = SlurmTimeLimitNotice()
    assert source.end_time({"SLURM_JOB_ID": "7", "SLURM_JOB_END_TIME": "1777636860"}) == 1777636860.0
    assert source.end_time({}) is None
    assert parse_deadline("") is None and parse_deadline("1777636800.5\n") == 1777636800.5
    assert parse_deadline("2026-05-01T12:00:00Z") == 1777636800.0
    for bad in ("soon", "nan", "inf"):
        with pytest.raises(ValueError):
            parse_deadline(bad)


def test_a_time_limit_counts_until_a_late_accounting_record_shows_the_jobs_own_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """slurmdbd can record a job seconds, on a busy machine a minute, after it starts: until the record
    tells, the time limit is a notice (requeued before the limit rather than killed at it); a
    ``--signal`` found then takes it back, and no ``--signal`` keeps it. Fake ``sacct``/``scontrol``:
    a late record cannot be made to happen on the real cluster."""
    tools = tmp_path / "bin"
    tools.mkdir()
    record = tmp_path / "submit-line"
    (tools / "sacct").write_text(f"#!/bin/sh\ncat {record}\n")
    (tools / "scontrol").write_text("#!/bin/sh\nprintf '#!/bin/bash\\nsrun python train.py\\n'\n")
    for tool in tools.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(int(time.time()) + 600))
    monkeypatch.delenv("SBATCH_SIGNAL", raising=False)

    def until(condition: Any) -> None:
        deadline = time.monotonic() + 20
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert condition()

    for submit_line, kept in (("sbatch --signal=USR1@50 job.sh", False), ("sbatch job.sh", True)):
        record.write_text("")  # not recorded yet
        source = SlurmTimeLimitNotice(interval=0.05)
        polls = Polls(source)
        poller = NoticePoller([source])
        poller.start()
        try:
            until(poller.notices)
            (early,) = poller.notices()
            assert early.is_time_limit and not source.signal_known and source.last_error is None
            record.write_text(submit_line + "\n")
            until(lambda source=source: source.signal_known)
            if kept:
                assert polls.more(3)  # three polls more that know the record: it stays
                assert poller.notices() == [early]
            else:
                until(lambda poller=poller: not poller.notices())  # taken back
        finally:
            poller.stop(wait=5)


def notice(kind: str = "terminate", deadline: float | None = 1000.0) -> Notice:
    return Notice("aws-spot", kind, deadline, received=880.0)


@pytest.mark.parametrize(
    ("notices", "now", "on_notice", "saved", "expected"),
    [
        ([], 900.0, "save_and_continue", False, Act.NONE),
        # 100 s left, 1 s to durable, 10 s margin, 0.5 s steps: room to save now and again later.
        ([notice()], 900.0, "save_and_continue", False, Act.SAVE),
        ([notice()], 900.0, "save_and_continue", True, Act.NONE),
        ([notice()], 900.0, "stop", False, Act.STOP),
        # The next check would start the last save after deadline - durable - margin (988.5 < 989).
        ([notice()], 988.6, "save_and_continue", True, Act.STOP),
        # Room to wait, but not to save now and once more: stop now.
        ([notice()], 988.0, "save_and_continue", False, Act.STOP),
        ([notice(deadline=None)], 900.0, "save_and_continue", False, Act.SAVE),
        ([notice(deadline=None)], 900.0, "save_and_continue", True, Act.NONE),
        # A time limit is no warning: nothing until its stop time, then stop.
        ([notice("time-limit")], 900.0, "save_and_continue", False, Act.NONE),
        ([notice("time-limit")], 900.0, "stop", False, Act.NONE),
        ([notice("time-limit")], 988.6, "save_and_continue", False, Act.STOP),
        ([notice("time-limit", 5000.0), notice(deadline=None)], 900.0, "save_and_continue", False, Act.SAVE),
    ],
)
def test_what_a_notice_asks_for(
    notices: list[Notice], now: float, on_notice: str, saved: bool, expected: Act
) -> None:
    act, _ = decide(
        notices, now=now, seconds_to_durable=1.0, margin=10.0, period=0.5, on_notice=on_notice, saved=saved
    )
    assert act == expected


def test_sources_apply_only_on_their_cloud_without_a_network_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dmi = tmp_path / "class" / "dmi" / "id"
    dmi.mkdir(parents=True)
    assert read_machine(tmp_path) == {}
    (dmi / "sys_vendor").write_text("Amazon EC2\n")
    assert on_aws(read_machine(tmp_path)) and not on_gce(read_machine(tmp_path))
    (dmi / "sys_vendor").write_text("Google\n")
    (dmi / "product_name").write_text("Google Compute Engine\n")
    assert on_gce(read_machine(tmp_path)) and not on_aws(read_machine(tmp_path))
    (dmi / "sys_vendor").write_text("Microsoft Corporation\n")
    (dmi / "product_name").write_text("Virtual Machine\n")
    assert not on_azure(read_machine(tmp_path))  # any Hyper-V machine says this
    (dmi / "chassis_asset_tag").write_text("7783-7084-3265-9085\n")
    assert on_azure(read_machine(tmp_path))
    (tmp_path / "hypervisor").mkdir()
    (tmp_path / "hypervisor" / "uuid").write_text("ec2e1916-9099-7caf-fd21-012345abcdef\n")
    assert on_aws(read_machine(tmp_path))
    # This machine is on no cloud: only an explicit endpoint makes a cloud source apply.
    assert not AwsSpotNotice().applies() and AwsSpotNotice(endpoint="http://127.0.0.1:9").applies()
    assert not GceNotice().applies() and not AzureNotice().applies()
    assert not SlurmTimeLimitNotice().applies() and not FileNotice().applies()
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("LIGHTNING_RESUME_NOTICE", str(tmp_path / "notice"))
    assert SlurmTimeLimitNotice().applies() and FileNotice().applies()
    assert FileNotice().target == tmp_path / "notice"


NOTICE_SEEN_BY_A_LATE_SOURCE = """
import sys, time
from pathlib import Path
Path(sys.argv[1]).write_text("started")
while not Path(sys.argv[2]).exists():
    time.sleep(0.01)
from lightning_resume.notices import FileNotice
print("old:", FileNotice(sys.argv[3]).poll() is not None, "new:", FileNotice(sys.argv[2]).poll() is not None)
"""


def test_a_notice_written_while_the_job_still_imports_counts(tmp_path: Path) -> None:
    """A preStop hook may write the file before the job's FileNotice exists: newer than the process
    is this attempt's notice; older than the process is a leftover."""
    started, new, old = tmp_path / "started", tmp_path / "new", tmp_path / "old"
    old.write_text("")
    os.utime(old, (time.time() - 5, time.time() - 5))
    job = subprocess.Popen(
        [sys.executable, "-c", NOTICE_SEEN_BY_A_LATE_SOURCE, str(started), str(new), str(old)],
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    new.write_text("")  # after the process started, before it constructs the source
    out, _ = job.communicate(timeout=60)
    assert out.split() == ["old:", "False", "new:", "True"], out


def test_file_notice_ignores_a_file_left_by_an_earlier_attempt(tmp_path: Path) -> None:
    flag = tmp_path / "preempted"
    flag.write_text("")
    os.utime(flag, (1.0, 1.0))  # long before this process started
    source = FileNotice(flag)
    assert source.poll() is None and "older than this process" in (source.last_error or "")
    flag.write_text("in a while")  # written now: a notice, whose deadline cannot be read
    found = source.poll()
    assert found is not None and found.deadline is None and "not a deadline" in (source.last_error or "")
    flag.write_text(f"{time.time() + 30:.0f}")
    found = source.poll()
    assert found is not None and found.deadline is not None and source.last_error is None


def test_poll_never_raises_and_the_poller_keeps_when_a_notice_was_first_seen() -> None:
    class Flaky(NoticeSource):
        name = "flaky"

        def __init__(self) -> None:
            super().__init__(interval=0.01)
            self.calls = 0

        def _poll(self, now: float) -> Notice | None:
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("boom")
            return Notice(self.name, "terminate", now + 100, received=now)

    source = Flaky()
    assert source.poll() is None and source.last_error == "RuntimeError: boom"
    poller = NoticePoller([source])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        poller.start()
        deadline = time.monotonic() + 10
        while source.calls < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        poller.stop(wait=5)
    (seen,) = poller.notices()
    assert seen.received < seen.deadline - 100  # the first sighting, not the latest poll
    assert not poller.running and not caught  # the failed poll was before the poller started


def test_bad_notice_arguments_are_refused() -> None:
    with pytest.raises(TypeError, match=r"notices must be Notices\(...\) from lightning_resume\.notices"):
        PreemptionHandler(notices=5)  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match="Notices sources must be 'auto', None or a list of notice sources, got 'aws'"
    ):
        Notices("aws")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Notices sources must be 'auto', None or a list of notice sources"):
        Notices([object()])  # type: ignore[list-item]
    with pytest.raises(
        ValueError, match="Notices on_notice must be one of 'save_and_continue', 'stop', got 'save'"
    ):
        Notices(on_notice="save")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Notices margin must be > 0"):
        Notices(margin=0)
    with pytest.raises(ValueError, match="endpoint must be a base URL"):
        AwsSpotNotice(endpoint="")
    with pytest.raises(TypeError, match="interval must be a number of seconds"):
        GceNotice(interval="5")  # type: ignore[arg-type]
    alone = FileNotice("/tmp/x")
    assert Notices(alone).sources == [alone]  # type: ignore[arg-type]  # one source alone
    assert DEFAULT_SECONDS_TO_DURABLE > 0


class MetaStrategy(DDPStrategy):
    """Two ranks whose root device is ``meta``: a tensor made on the CPU cannot pass for it."""

    def __init__(self) -> None:
        super().__init__(accelerator=None)
        self.seen: list[tuple[torch.device, Any]] = []

    @property
    def root_device(self) -> torch.device:
        return torch.device("meta")

    @property
    def world_size(self) -> int:
        return 2

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        self.seen.append((tensor.device, reduce_op))
        return torch.tensor(3)  # the other rank received a signal


def test_the_act_agreement_is_a_max_reduce_on_the_strategy_device() -> None:
    strategy = MetaStrategy()
    assert _collectives.max_over_ranks(strategy, 1) == 3
    assert strategy.seen == [(torch.device("meta"), "max")]


def test_pytorch_lightning_projects_take_the_sources_from_the_mirror() -> None:
    pytest.importorskip("pytorch_lightning")
    from lightning_resume.pytorch_lightning import PreemptionHandler as MirroredHandler
    from lightning_resume.pytorch_lightning import notices as mirrored

    handler = MirroredHandler(notices=mirrored.Notices([mirrored.FileNotice("/tmp/x")]))
    handler.uninstall()
    with pytest.raises(TypeError, match=r"notice sources from lightning_resume\.pytorch_lightning\.notices"):
        mirrored.Notices([FileNotice("/tmp/x")])
    with pytest.raises(TypeError, match=r"Notices\(...\) from lightning_resume\.pytorch_lightning\.notices"):
        MirroredHandler(notices=Notices())


def test_the_flat_notice_arguments_of_0x_still_work_with_a_future_warning() -> None:
    source = FileNotice("/tmp/lr-never-there")
    with pytest.warns(FutureWarning, match=r"pass notices=Notices\(sources"):
        handler = PreemptionHandler(notices=[source], on_notice="stop", notice_margin=5)
    assert handler.notices == Notices([source], on_notice="stop", margin=5)
    with pytest.warns(FutureWarning):
        assert PreemptionHandler(notices="auto").notices == Notices()  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert PreemptionHandler(notices=None).notices is None
        assert PreemptionHandler().notices == Notices()
