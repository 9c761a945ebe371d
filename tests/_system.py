"""What this machine lets a test do to the operating system: private mounts, dropped privileges."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess


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
