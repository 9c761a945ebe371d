"""A full disk (ENOSPC on a real 4 MiB tmpfs) and a read-only directory (EACCES from the kernel).

Both run a real ``trainer.fit`` in a subprocess: the tmpfs is mounted in a private mount namespace
(``unshare -m``), so nothing outlives the test. Root ignores file permissions, so the permission case
runs as root without ``CAP_DAC_OVERRIDE`` (``setpriv``), or as is when not root. Each case runs with
asynchronous and synchronous saves. Skipped where the sandbox allows neither.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _system import can_unshare_mounts, permission_prefix

SCRIPT = r"""
import errno, json, os, sys, warnings
warnings.filterwarnings("ignore")
import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning_resume import DurableCheckpointIO
from lightning_resume._storage.manifest import checksum_file, read_entries

mode, root = sys.argv[1], sys.argv[2]


class Break(pl.Callback):
    # After the checkpoint of step 1 is committed, make the disk refuse every later save.
    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step != 2:
            return
        trainer.strategy.checkpoint_io.wait_until_durable()
        if mode == "enospc":
            with open(os.path.join(root, "filler"), "wb") as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                except OSError as e:
                    assert e.errno == errno.ENOSPC
        else:
            os.chmod(folder, 0o555)


results = {}
for asynchronous in (True, False):
    folder = os.path.join(root, f"async={asynchronous}")
    io = DurableCheckpointIO(asynchronous=asynchronous)
    last = ModelCheckpoint(dirpath=folder, every_n_train_steps=1, save_top_k=0, save_last=True)
    trainer = pl.Trainer(
        max_steps=4, limit_val_batches=0, logger=False, enable_progress_bar=False,
        enable_model_summary=False, plugins=[io], default_root_dir=folder,
        callbacks=[Break(), last],
    )
    error = None
    try:
        trainer.fit(BoringModel())
    except OSError as e:
        error = {"errno": e.errno, "type": type(e).__name__, "message": str(e)}
    last = os.path.join(folder, "last.ckpt")
    entry = next((e for e in read_entries(last) or [] if (e.size, e.checksum) == checksum_file(last)), None)
    loaded = DurableCheckpointIO(asynchronous=False).load_checkpoint(last)["global_step"]
    results[str(asynchronous)] = {
        "error": error,
        "verified_step": entry.global_step if entry else None,
        "loaded_step": loaded,
        "files": sorted(os.listdir(folder)),
    }
    if mode == "enospc":
        os.unlink(os.path.join(root, "filler"))
    else:
        os.chmod(folder, 0o755)
print("RESULT " + json.dumps(results))
"""


def check(results: dict[str, dict], err: int, hint: str, error_type: str) -> None:
    for mode, result in results.items():
        error = result["error"]
        assert error is not None, f"async={mode}: fit did not fail"
        assert error["errno"] == err and error["type"] == error_type, error
        assert "Could not save checkpoint" in error["message"] and "last.ckpt" in error["message"]
        assert "The previous checkpoint is intact" in error["message"] and hint in error["message"]
        assert result["verified_step"] == result["loaded_step"] == 1, result
        assert result["files"] == ["last.ckpt", "last.ckpt.manifest.json"], result  # no temporary litter


def parse(proc: subprocess.CompletedProcess[str]) -> dict[str, dict]:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    results: dict[str, dict] = json.loads(line[len("RESULT ") :])
    return results


@pytest.mark.skipif(not can_unshare_mounts(), reason="needs mount namespaces (unshare -m) to mount a tmpfs")
def test_a_full_disk_fails_the_save_clearly_and_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    script, mount = tmp_path / "job.py", tmp_path / "small"
    script.write_text(SCRIPT)
    mount.mkdir()
    shell = (
        f'mount -t tmpfs -o size=4m tmpfs "{mount}" && exec "{sys.executable}" "{script}" enospc "{mount}"'
    )
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", shell],
        capture_output=True,
        text=True,
        timeout=300,
    )
    check(parse(proc), 28, "free space", "OSError")


@pytest.mark.skipif(permission_prefix() is None, reason="cannot drop CAP_DAC_OVERRIDE here")
def test_a_read_only_directory_fails_the_save_clearly_and_keeps_the_previous_checkpoint(
    tmp_path: Path,
) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [*(permission_prefix() or []), sys.executable, str(script), "eacces", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    check(parse(proc), 13, "writable by the user", "PermissionError")
