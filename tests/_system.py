"""What this machine lets a test do to the operating system: private mounts, dropped privileges."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@functools.cache
def can_unshare_mounts() -> bool:
    """Whether ``unshare -m`` can mount a tmpfs in a private mount namespace here."""
    if shutil.which("unshare") is None:
        return False
    probe = "mkdir -p /tmp/.lr-probe && mount -t tmpfs -o size=64k tmpfs /tmp/.lr-probe"
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", probe]).returncode == 0


@functools.cache
def permission_prefix() -> tuple[str, ...] | None:
    """A command prefix under which file permissions apply, or ``None`` when there is none.

    Root ignores file permissions; ``setpriv`` without ``CAP_DAC_OVERRIDE`` does not.
    """
    if os.geteuid() != 0:
        return ()
    if shutil.which("setpriv") is None:
        return None
    prefix = ("setpriv", "--bounding-set=-dac_override,-dac_read_search", "--")
    return prefix if subprocess.run([*prefix, "true"]).returncode == 0 else None


@contextlib.contextmanager
def mounted_tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """``folder`` made a tmpfs of ``size`` (``mount -o size=...``) until the block ends; skips the test
    where no tmpfs can be mounted (not root, or no mount permission)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    folder.mkdir(parents=True, exist_ok=True)
    options = f"size={size}"
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
