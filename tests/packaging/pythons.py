"""The exactness core on every Python the package declares: ``pythons.py --deps ... -- PYTEST_ARGS``.

The declared Pythons are pyproject.toml's ``Programming Language :: Python :: 3.X`` classifiers. Each is
looked for where users keep them: pyenv's versions folder (``$PYENV_ROOT/versions/3.X.N/bin/python``, newest
patch first), then ``python3.X`` on the PATH. A declared Python that is absent gets a line saying so and is
skipped. Each one found gets a venv of its own (``.venv-py3.X``, kept for the next run), torch first (as the
Makefile does: ``--torch``), then ``--deps``, and runs ``python -m pytest PYTEST_ARGS`` in the checkout.
Prints a table of the results and times; exit status 1 if any Python failed.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OFFLINE = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "SWANLAB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
#: What a candidate interpreter prints when it can make a venv with pip: its ``major.minor``.
PROBE = "import ensurepip, sys, venv; print('%d.%d' % sys.version_info[:2])"


@dataclass
class Result:
    """What happened on one declared Python (``interpreter`` is ``None`` when it was not run)."""

    version: str
    interpreter: str | None
    outcome: str
    setup_s: float = 0.0
    tests_s: float = 0.0
    failed: bool = False


def declared(root: Path = ROOT) -> list[str]:
    """The ``3.X`` versions pyproject.toml's classifiers declare, oldest first."""
    text = (root / "pyproject.toml").read_text()
    found = set(re.findall(r'"Programming Language :: Python :: (3\.\d+)"', text))
    return sorted(found, key=lambda v: int(v.split(".")[1]))


def candidates(version: str, environ: dict[str, str]) -> list[str]:
    """Where ``version`` may be, in the order tried: pyenv's versions folder, newest patch first, then the
    PATH."""
    versions = Path(environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    pattern = re.compile(rf"{re.escape(version)}\.(\d+)")  # 3.13.0, not 3.13.0t (free-threaded) or 3.13-dev
    found = [(int(m[1]), p) for p in versions.glob(f"{version}.*") if (m := pattern.fullmatch(p.name))]
    paths = [str(p / "bin" / "python") for _, p in sorted(found, reverse=True)]
    on_path = shutil.which(f"python{version}", path=environ.get("PATH"))
    return paths + ([on_path] if on_path else [])


def find(version: str, environ: dict[str, str]) -> tuple[str | None, str]:
    """The first interpreter of ``version`` that runs and can make a venv, and what was looked at."""
    tried = []
    for path in candidates(version, environ):
        try:
            probe = subprocess.run([path, "-c", PROBE], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            tried.append(f"{path}: {e}")
            continue
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return path, ""
        tried.append(f"{path}: {(probe.stderr.strip().splitlines() or [probe.stdout.strip()])[-1]}")
    where = f"pyenv's versions folder ({version}.N) and python{version} on the PATH"
    return None, f"not found in {where}" + (f"; tried {'; '.join(tried)}" if tried else "")


def _run(argv: list[str], **kwargs: object) -> int:
    print(f"$ {shlex.join(argv)}", flush=True)
    return subprocess.run(argv, cwd=ROOT, **kwargs).returncode  # type: ignore[call-overload,no-any-return]


def run_on(version: str, interpreter: str, args: argparse.Namespace) -> Result:
    """Make (or reuse) ``.venv-py{version}``, install into it and run the tests."""
    venv = ROOT / f".venv-py{version}"
    python = str(venv / "bin" / "python")
    start = time.monotonic()
    steps = [] if Path(python).exists() else [[interpreter, "-m", "venv", str(venv)]]
    # No bytecode compiled at install: torch's thousands of modules cost half a minute of CPU per venv, and
    # the tests compile the few they import.
    pip = [python, "-m", "pip", "install", "-q", "--no-compile"]
    steps.append([*pip, "--upgrade", "pip"])
    if args.torch:
        steps.append([*pip, args.torch, *shlex.split(args.torch_pip_args)])
    steps.append([*pip, *shlex.split(args.deps)])
    for step in steps:
        if _run(step) != 0:
            return Result(version, interpreter, f"install failed: {shlex.join(step[1:])}", failed=True)
    setup = time.monotonic() - start
    start = time.monotonic()
    env = {**os.environ, **OFFLINE, "PYTHONUNBUFFERED": "1"}  # its lines as they come
    out = subprocess.Popen(
        [python, "-m", "pytest", *args.pytest_args], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    last = ""
    assert out.stdout is not None
    for line in out.stdout:
        print(line, end="", flush=True)
        last = line.strip() or last
    status = out.wait()
    counts = re.sub(r", \d+ warnings?| in [\d.]+s.*", "", last.strip("= "))  # "41 passed, 8 skipped"
    return Result(version, interpreter, counts, setup, time.monotonic() - start, status != 0)


def table(results: list[Result], total_s: float) -> str:
    lines = [f"{'python':<7} {'setup':>6} {'tests':>6}  {'result':<40} interpreter"]
    for r in results:
        if r.interpreter is None:
            lines.append(f"{r.version:<7} {'':>6} {'':>6}  skipped: {r.outcome}")
            continue
        outcome = ("FAILED: " if r.failed else "") + r.outcome
        times = f"{r.setup_s:>5.0f}s {r.tests_s:>5.0f}s"
        lines.append(f"{r.version:<7} {times}  {outcome:<40} {r.interpreter}")
    lines.append(f"wall time: {total_s:.0f} s")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip", default="", help="3.X versions to leave out, space-separated")
    parser.add_argument("--skip-reason", default="left out (--skip)", help="the skip line's words for them")
    parser.add_argument("--torch", default="", help="the torch requirement installed first (none if empty)")
    parser.add_argument("--torch-pip-args", default="", help="pip arguments for that install")
    parser.add_argument("--deps", required=True, help="pip install arguments for the rest, e.g. '-e .[data]'")
    parser.add_argument("pytest_args", nargs="*", help="after --: the pytest arguments")
    args = parser.parse_args(argv)
    start, results = time.monotonic(), []
    for version in declared():
        if version in args.skip.split():
            results.append(Result(version, None, args.skip_reason))
            continue
        interpreter, why = find(version, dict(os.environ))
        if interpreter is None:
            print(f"python {version}: skipped: {why}", flush=True)
            results.append(Result(version, None, why))
            continue
        print(f"\n=== python {version}: {interpreter} ===", flush=True)
        results.append(run_on(version, interpreter, args))
    print(f"\nThe exactness core on the declared Pythons ({', '.join(declared())}):")
    print(table(results, time.monotonic() - start))
    return 1 if any(r.failed for r in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
