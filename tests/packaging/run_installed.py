"""Run an installed (not editable) lightning_resume outside the checkout: ``python run_installed.py VENV``.

``VENV`` is a virtual environment holding the built wheel (``make test-wheel`` makes it). Each command runs
in an empty temporary directory, with ``PYTHONPATH`` unset and the trackers offline, so nothing can come
from the checkout: where the package is imported from, ``lightning-resume --version`` against the wheel's
metadata, ``lightning-resume doctor``, ``lightning-resume demo`` and :mod:`resume_job` (a real SIGKILL and
relaunch, exact final weights). Prints each command's output, exit status and wall time; exit status 1 if
any failed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parents[1]
OFFLINE = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "SWANLAB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
#: Where the package is imported from, and the version its metadata and the module give.
WHERE = (
    "import importlib.metadata as m, lightning_resume as lr; "
    "print(lr.__file__); print(lr.__version__, m.version('lightning-resume'))"
)


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """Run ``argv`` in ``cwd``; print its command line, output, exit status and wall time."""
    print(f"\n$ {' '.join(Path(argv[0]).name if i == 0 else a for i, a in enumerate(argv))}", flush=True)
    start = time.monotonic()
    done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(done.stdout, end="" if done.stdout.endswith("\n") else "\n")
    print(f"[exit status {done.returncode}, {time.monotonic() - start:.0f} s]", flush=True)
    return done.returncode, done.stdout


def main(venv: Path) -> int:
    bin_dir = venv.resolve() / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH")}
    env.update(OFFLINE, PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv.resolve()))
    env.setdefault("COLUMNS", "120")  # rich's tables, whole in a CI log
    python, cli = str(bin_dir / "python"), str(bin_dir / "lightning-resume")
    problems = []
    with tempfile.TemporaryDirectory(prefix="lightning-resume-installed-") as tmp:
        work = Path(tmp)
        if work.is_relative_to(CHECKOUT):
            raise SystemExit(f"the temporary directory {work} is inside the checkout: set TMPDIR elsewhere")
        status, out = run([python, "-c", WHERE], work, env)
        lines = out.split()
        if status != 0 or len(lines) != 3 or not Path(lines[0]).is_relative_to(venv.resolve()):
            problems.append(f"lightning_resume is not imported from {venv}: {out.strip()}")
        elif lines[1] != lines[2]:
            problems.append(f"lightning_resume.__version__ {lines[1]} is not the wheel's version {lines[2]}")
        version = lines[1] if len(lines) == 3 else "?"
        status, out = run([cli, "--version"], work, env)
        if status != 0 or out.strip() != f"lightning-resume {version}":
            problems.append(f"--version printed {out.strip()!r}, not 'lightning-resume {version}'")
        for argv in ([cli, "doctor", "--root", "runs", "--write-test", "8"], [cli, "demo"]):
            status, _ = run(argv, work, env)
            if status != 0:
                problems.append(f"{' '.join(argv[1:3])} exited with status {status}")
        job = Path(shutil.copy(HERE / "resume_job.py", work))
        status, _ = run([python, job.name], work, env)
        if status != 0:
            problems.append(f"the kill-and-resume job ({job.name}) exited with status {status}")
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    if not problems:
        print(f"\nok: the installed wheel in {venv} ran doctor, demo and a kill-and-resume job from {tmp}")
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: {sys.argv[0]} VENV")
    sys.exit(main(Path(sys.argv[1])))
