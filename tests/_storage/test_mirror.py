"""The mirror: a real S3-protocol server on loopback (moto's server mode) and a plain local directory."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from _s3 import moto_endpoint, new_bucket, s3_options
from conftest import job_env
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_resume import DurableCheckpointIO, Mirror
from lightning_resume._storage.catalog import Status, check_file, verify
from lightning_resume._storage.kinds import DIRECTORY, FILE, new_save_dir
from lightning_resume._storage.manifest import (
    MANIFEST_SUFFIX,
    Entry,
    checksum_file,
    encode,
    read_entries,
)
from lightning_resume._storage.mirror import Mirroring
from lightning_resume.io.sharded import parts


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    yield from moto_endpoint()


@pytest.fixture(params=["local", "s3"])
def mirror(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """``(url, fsspec options)`` of an empty mirror."""
    if request.param == "local":
        return str(tmp_path / "mirror"), {}
    endpoint = request.getfixturevalue("s3_endpoint")
    return f"s3://{new_bucket(endpoint)}/run", s3_options(endpoint)


def remote_names(url: str, options: dict[str, Any]) -> list[str]:
    remote = Mirroring(url, options).store
    remote.fs.invalidate_cache()
    return sorted(p.rsplit("/", 1)[-1] for p in remote.fs.ls(remote.root, detail=False))


class StartStep(pl.Callback):
    step: int | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.step = trainer.global_step


def fit(folder: Path, io: DurableCheckpointIO, max_steps: int, *callbacks: pl.Callback, **ckpt: Any) -> None:
    options = {"every_n_train_steps": 1, "save_top_k": -1, "save_last": True, **ckpt}
    trainer = pl.Trainer(
        max_steps=max_steps,
        limit_val_batches=0,
        plugins=[io],
        callbacks=[ModelCheckpoint(dirpath=folder, filename="{step}", **options), *callbacks],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(BoringModel(), ckpt_path="last" if (folder / "last.ckpt").exists() else None)


def verifies(path: Path) -> bool:
    return check_file(path).status is Status.VERIFIED


def test_mirror_uploads_with_retention_and_restores_onto_an_empty_dir(
    tmp_path: Path, mirror: tuple[str, dict[str, Any]]
) -> None:
    url, options = mirror
    local = tmp_path / "node-a"
    fit(local, DurableCheckpointIO(mirror=Mirror(url, options), keep=2), 4)
    expected = ["last.ckpt", "step=3.ckpt", "step=4.ckpt"]
    assert sorted(p.name for p in local.glob("*.ckpt")) == expected
    assert remote_names(url, options) == sorted(expected + [n + MANIFEST_SUFFIX for n in expected])

    shutil.rmtree(local)  # requeued onto a node whose local disk is empty
    io = DurableCheckpointIO(mirror=Mirror(url, options), dirpath=local, keep=2)
    assert sorted(p.name for p in local.glob("*.ckpt")) == expected
    assert all(verifies(local / name) for name in expected)
    start = StartStep()
    fit(local, io, 6, start)
    assert start.step == 4
    assert sorted(p.name for p in local.glob("*.ckpt")) == ["last.ckpt", "step=5.ckpt", "step=6.ckpt"]
    remote_data = [n for n in remote_names(url, options) if n.endswith(".ckpt")]
    assert remote_data == ["last.ckpt", "step=5.ckpt", "step=6.ckpt"]


def test_deletes_by_lightning_reach_the_mirror(tmp_path: Path) -> None:
    url, local = str(tmp_path / "mirror"), tmp_path / "ckpt"
    fit(local, DurableCheckpointIO(mirror=url), 5, save_top_k=2, monitor="step", mode="max", save_last=False)
    assert remote_names(url, {}) == [
        "step=4.ckpt",
        f"step=4.ckpt{MANIFEST_SUFFIX}",
        "step=5.ckpt",
        f"step=5.ckpt{MANIFEST_SUFFIX}",
    ]


def test_a_remote_copy_counts_only_when_its_data_matches_its_manifest(tmp_path: Path) -> None:
    url = str(tmp_path / "mirror")
    remote = Mirroring(url)
    good = tmp_path / "good.ckpt"
    torch.save({"global_step": 1}, good)
    size, checksum = checksum_file(good)
    (tmp_path / "mirror").mkdir()
    shutil.copy(good, tmp_path / "mirror" / "a.ckpt")  # data without a manifest: an upload cut short
    (tmp_path / "mirror" / "b.ckpt").write_bytes(good.read_bytes()[:-10])  # torn data under its manifest
    (tmp_path / "mirror" / f"b.ckpt{MANIFEST_SUFFIX}").write_text(encode([Entry(size, checksum)]))
    shutil.copy(good, tmp_path / "mirror" / "c.ckpt")
    (tmp_path / "mirror" / f"c.ckpt{MANIFEST_SUFFIX}").write_text(encode([Entry(size, checksum)]))
    assert list(remote.committed(FILE)) == ["c.ckpt"]
    assert remote.restore(FILE, tmp_path / "local", "a.ckpt") is None
    (tmp_path / "local").mkdir()
    assert remote.restore(FILE, tmp_path / "local", "b.ckpt") is None
    assert remote.restore(FILE, tmp_path / "local", "c.ckpt") is not None
    assert sorted(p.name for p in (tmp_path / "local").iterdir()) == ["c.ckpt", f"c.ckpt{MANIFEST_SUFFIX}"]


@pytest.mark.parametrize("attempts", [3, 1])
def test_a_remote_copy_replaced_during_its_download_is_downloaded_again(
    tmp_path: Path, s3_endpoint: str, attempts: int
) -> None:
    # s3fs reads an object only while it is the version it opened (If-Match on its ETag); here the
    # object is replaced, on the real server, right after the download opened it.
    url = f"s3://{new_bucket(s3_endpoint)}/run"
    remote = Mirroring(url, s3_options(s3_endpoint))
    store = remote.store
    old, new = tmp_path / "old.ckpt", tmp_path / "new.ckpt"
    torch.save({"global_step": 1, "w": torch.randn(1000)}, old)
    torch.save({"global_step": 2, "w": torch.randn(1000)}, new)
    old_entry, new_entry = Entry(*checksum_file(old)), Entry(*checksum_file(new))
    store.fs.pipe_file(store.key("last.ckpt"), old.read_bytes())
    store.fs.pipe_file(store.key("last.ckpt") + MANIFEST_SUFFIX, encode([old_entry]).encode())
    real_open, opened = store.fs.open, []

    def open_then_replace(path: str, mode: str = "rb", **kwargs: Any) -> Any:
        handle = real_open(path, mode, **kwargs)
        if not opened:  # an upload landing: manifest with both entries, then the data
            store.fs.pipe_file(path + MANIFEST_SUFFIX, encode([new_entry, old_entry]).encode())
            store.fs.pipe_file(path, new.read_bytes())
        opened.append(path)
        return handle

    store.fs.open = open_then_replace
    target = tmp_path / "local" / "last.ckpt"
    target.parent.mkdir()
    if attempts == 1:
        with pytest.raises(OSError, match=r"Could not download .*last\.ckpt.* from the mirror"):
            remote.restore(FILE, target.parent, "last.ckpt", attempts=1)
        assert not target.exists() and os.listdir(target.parent) == []  # no temporary litter
        return
    assert remote.restore(FILE, target.parent, "last.ckpt", attempts=attempts) == target
    assert read_entries(target) == [new_entry]
    assert len(opened) == 2 and target.read_bytes() == new.read_bytes()


def test_a_corrupt_local_file_is_replaced_by_its_mirror_copy_on_load(tmp_path: Path) -> None:
    url, local = str(tmp_path / "mirror"), tmp_path / "ckpt"
    fit(local, DurableCheckpointIO(mirror=url), 3, save_top_k=0)
    data = bytearray((local / "last.ckpt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (local / "last.ckpt").write_bytes(bytes(data))
    io = DurableCheckpointIO(mirror=url, dirpath=local)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = io.load_checkpoint(local / "last.ckpt")
    assert loaded["global_step"] == 3 and verifies(local / "last.ckpt")
    assert any("the mirror copy of it" in str(w.message) for w in caught)
    io.teardown()


def test_a_missing_backend_names_the_extra_to_install() -> None:
    code = (
        "import sys; sys.modules['s3fs'] = None\n"
        "from lightning_resume import DurableCheckpointIO\n"
        "try:\n"
        "    DurableCheckpointIO(mirror='s3://bucket/x')\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=job_env())
    assert 'pip install "lightning-resume[remote]"' in proc.stdout, proc.stderr
    with pytest.raises(ValueError, match="cannot mirror"):
        DurableCheckpointIO(mirror="nosuchprotocol://x")


KILLED_UPLOAD = """
import os, signal, sys, time, warnings
warnings.filterwarnings("ignore")
import lightning.pytorch as pl, torch
from torch import nn
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning_resume import DurableCheckpointIO, Mirror

folder, url, endpoint, delay = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
options = {"key": "test", "secret": "test", "client_kwargs": {"endpoint_url": endpoint}}
io = DurableCheckpointIO(mirror=Mirror(url, options, wait=False), dirpath=folder)

class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(2048, 1024)  # 8 MB of weights, 24 MB with Adam's state
    def training_step(self, batch, batch_idx):
        return self.net(batch).pow(2).mean()
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters())
    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.randn(16, 2048), batch_size=4)

class Kill(pl.Callback):
    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == 2:
            io.wait_until_durable(mirrored=True)  # step 1 is on the mirror; step 2 is saved after this hook
        if trainer.global_step == 3:
            io.wait_until_durable()  # step 2 is committed locally, its upload has started
            time.sleep(delay)
            os.kill(os.getpid(), signal.SIGKILL)

last = ModelCheckpoint(dirpath=folder, save_top_k=0, save_last=True, every_n_train_steps=1)
trainer = pl.Trainer(max_steps=10, plugins=[io], logger=False, enable_progress_bar=False,
                     enable_model_summary=False, callbacks=[Kill(), last])
trainer.fit(Model())
"""


@pytest.mark.long
def test_an_interrupted_upload_is_never_counted(tmp_path: Path, s3_endpoint: str) -> None:
    script = tmp_path / "job.py"
    script.write_text(KILLED_UPLOAD)
    interrupted = 0
    for delay in (0.05, 0.2):
        url, folder = f"s3://{new_bucket(s3_endpoint)}/run", tmp_path / f"node-{delay}"
        cmd = [sys.executable, str(script), str(folder), url, s3_endpoint, str(delay)]
        proc = subprocess.run(cmd, env=job_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == -9, proc.stderr[-3000:]
        assert read_entries(folder / "last.ckpt")[0].global_step == 2  # type: ignore[index]

        empty = tmp_path / f"empty-{delay}"
        io = DurableCheckpointIO(mirror=Mirror(url, s3_options(s3_endpoint)), dirpath=empty)
        restored = empty / "last.ckpt"
        assert verifies(restored)
        step = read_entries(restored)[0].global_step  # type: ignore[index]
        assert step in (1, 2)
        interrupted += step == 1  # S3 shows no partial object: the old copy is what counts
        assert torch.load(restored, weights_only=True)["global_step"] == step
        assert not any(n.startswith(".lr-upload-") for n in remote_names(url, s3_options(s3_endpoint)))
        io.teardown()
    assert interrupted, "no kill landed during an upload: the test proves nothing"


@pytest.mark.slow
def test_processes_of_one_node_restore_a_node_local_dir_once(tmp_path: Path) -> None:
    remote, local = tmp_path / "remote", tmp_path / "node-local"
    io = DurableCheckpointIO(asynchronous=False, mirror=f"file://{remote}", dirpath=tmp_path / "first")
    for step in (1, 2, 3):
        io.save_checkpoint(
            {"global_step": step, "w": torch.randn(1 << 16)}, tmp_path / "first" / f"s{step}.ckpt"
        )
    io.teardown()
    # Four processes of one node construct the plugin at the same moment over one empty directory.
    code = (
        "import logging, sys; logging.basicConfig(level=logging.INFO, format='%(message)s'); "
        "from lightning_resume import DurableCheckpointIO; "
        f"DurableCheckpointIO(mirror={f'file://{remote}'!r}, dirpath={str(local)!r})"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True, env=job_env())
        for _ in range(4)
    ]
    logs = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), logs
    downloads = [line for text in logs for line in text.splitlines() if line.startswith("restored ")]
    assert sorted(line.split()[1] for line in downloads) == [str(local / f"s{n}.ckpt") for n in (1, 2, 3)]
    assert all(verifies(local / f"s{n}.ckpt") for n in (1, 2, 3))


# -- checkpoint directories (sharded checkpoints) --------------------------------------------------


def committed_directory(folder: Path, step: int, fill: int) -> Path:
    """A committed checkpoint directory of two ranks' shards, as DirectorySaver leaves it."""
    save_dir = new_save_dir(folder)
    for name, size in (("__0_0.distcp", 3000), ("__1_0.distcp", 2000), (".metadata", 100), ("meta.pt", 50)):
        (save_dir / name).write_bytes(bytes([fill]) * size)
    for rank in (0, 1):
        parts.write_part(save_dir, rank, parts.hash_files(save_dir, parts.dcp_files_of(save_dir, rank)))
    manifest = parts.build_manifest(save_dir, 2, parts.DCP_REQUIRED, global_step=step, saved_at=float(step))
    return parts.commit_directory(save_dir, folder / "last.ckpt", manifest, keep=2)


def test_a_checkpoint_directory_is_mirrored_and_restored_onto_an_empty_dir(
    tmp_path: Path, mirror: tuple[str, dict[str, Any]]
) -> None:
    url, options = mirror
    local = tmp_path / "local"
    remote = Mirroring(url, options, keep=2)
    for step in (1, 2, 3):
        final = committed_directory(local, step, fill=step)
        assert remote.upload(DIRECTORY, final)
    assert DIRECTORY.remote_target(remote.store) == final.name
    # Older remote directories go after the pointer names the new one (keep=2).
    assert sorted(m.global_step for m in remote.committed(DIRECTORY).values()) == [2, 3]  # type: ignore[type-var]

    empty = tmp_path / "node2"
    empty.mkdir()
    restored = Mirroring(url, options).restore_directory(empty, "last.ckpt")
    assert restored == empty / final.name
    assert os.readlink(empty / "last.ckpt") == final.name
    assert verify(empty / "last.ckpt", DIRECTORY).status is Status.VERIFIED
    assert all((final / f).read_bytes() == (restored / f).read_bytes() for f in parts.list_files(final))
    assert Mirroring(url, options).restore_directory(empty, "last.ckpt") is None  # as new as the mirror's


def test_a_damaged_or_unfinished_remote_directory_is_never_restored(
    tmp_path: Path, mirror: tuple[str, dict[str, Any]]
) -> None:
    url, options = mirror
    local = tmp_path / "local"
    remote = Mirroring(url, options, keep=3)
    older = committed_directory(local, 1, fill=1)
    remote.upload(DIRECTORY, older)
    newer = committed_directory(local, 2, fill=2)
    remote.upload(DIRECTORY, newer)
    # An upload killed before its manifest: files only.
    store = remote.store
    unfinished = f"{store.root}/.lr-ckpt-00000003-0000beef"
    with contextlib.suppress(OSError):  # S3 has no folders
        store.fs.makedirs(unfinished, exist_ok=True)
    store.fs.pipe_file(f"{unfinished}/__0_0.distcp", b"x" * 3000)
    # The newest committed remote copy rots: same size, other bytes.
    store.fs.pipe_file(f"{store.root}/{newer.name}/__1_0.distcp", b"\x07" * 2000)
    empty = tmp_path / "node2"
    empty.mkdir()
    restored = Mirroring(url, options).restore_directory(empty, "last.ckpt")
    assert restored == empty / older.name
    assert verify(empty / "last.ckpt", DIRECTORY).status is Status.VERIFIED
    assert sorted(p.name for p in empty.iterdir()) == sorted(["last.ckpt", older.name])
