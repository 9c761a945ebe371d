"""Build the sdist and the wheel and check them: ``python tests/packaging/check_dist.py [OUT]``.

Builds the sdist, the wheel from that sdist (what ``pip install`` of the sdist makes) and a wheel straight
from the checkout, each with ``python -m build`` in its own isolated build environment, and checks that:

- the wheel holds every file of the package (modules, ``py.typed``, data) and nothing else: no tests,
  docs, caches or leftovers of an earlier build; its metadata names this version and declares the
  ``lightning-resume`` console script only;
- the sdist holds what builds the wheel and no tests or caches;
- both wheels hold the same files with the same bytes;
- ``twine check --strict`` finds the metadata renders.

The sdist and the wheel built from it are left in ``OUT`` (default: ``dist``), and the wheel's file list in
``OUT/wheel-files.txt``. Prints what it found; exit status 1 with one line per problem.
"""

from __future__ import annotations

import ast
import base64
import configparser
import csv
import hashlib
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from email.parser import Parser
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "lightning_resume"
#: What setuptools writes into a wheel's ``.dist-info`` (``licenses/`` once the project has a license file).
DIST_INFO = {"METADATA", "WHEEL", "RECORD", "entry_points.txt", "top_level.txt"}
#: What an sdist may hold besides the package: what builds the wheel, and setuptools' own records.
SDIST_EXTRA = {"PKG-INFO", "README.md", "pyproject.toml", "setup.cfg", "MANIFEST.in"}
CACHES = ("__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache")
_DATA_HINT = " (not a module: add it to [tool.setuptools.package-data] in pyproject.toml)"


def source_version(root: Path = ROOT) -> str:
    """``__version__`` from ``lightning_resume/_version.py``, read without importing the package."""
    tree = ast.parse((root / PACKAGE / "_version.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__version__"]:
            return str(ast.literal_eval(node.value))
    raise ValueError(f"no __version__ = '...' in {root / PACKAGE / '_version.py'}")


def package_files(root: Path = ROOT) -> set[str]:
    """Every file of the package in the checkout, as paths in a wheel: what git tracks or would (tracked and
    untracked files that ``.gitignore`` leaves in), or every non-cache file where git is not at hand."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", PACKAGE],
            cwd=root, capture_output=True, text=True, check=True,
        ).stdout.split("\0")  # fmt: skip
        names = {name for name in listed if name and (root / name).is_file()}  # deleted but not committed
    except (OSError, subprocess.CalledProcessError):
        names = {p.relative_to(root).as_posix() for p in (root / PACKAGE).rglob("*") if p.is_file()}
    return {name for name in names if not is_cache(name)}


def is_cache(name: str) -> bool:
    """Whether a path is a cache of Python or of a tool (``__pycache__/``, ``.pyc``, ``.mypy_cache/``)."""
    return any(part in CACHES for part in PurePosixPath(name).parts) or name.endswith((".pyc", ".pyo"))


def project_table(root: Path = ROOT) -> dict:
    """pyproject.toml's ``[project]`` table."""
    import tomllib  # Python 3.11+: imported here, so that Python 3.10's test run can import this module

    return tomllib.loads((root / "pyproject.toml").read_text())["project"]


def wheel_problems(wheel: Path, expected: set[str], version: str, root: Path = ROOT) -> list[str]:
    """What is wrong with ``wheel``: files missing or extra against ``expected``, and its metadata."""
    project = project_table(root)
    dist_info = f"{PACKAGE}-{version}.dist-info"
    problems = []
    if wheel.name != f"{PACKAGE}-{version}-py3-none-any.whl":
        problems.append(f"{wheel.name}: expected {PACKAGE}-{version}-py3-none-any.whl (pure Python)")
    with zipfile.ZipFile(wheel) as zf:
        names = {n for n in zf.namelist() if not n.endswith("/")}
        package = {n for n in names if n.startswith(f"{PACKAGE}/")}
        meta = {n.removeprefix(f"{dist_info}/") for n in names if n.startswith(f"{dist_info}/")}
        for name in sorted(expected - package):
            problems.append(f"missing from the wheel: {name}{'' if name.endswith('.py') else _DATA_HINT}")
        problems += [f"in the wheel but not a file of the package: {n}" for n in sorted(package - expected)]
        other = names - package - {f"{dist_info}/{n}" for n in meta}
        problems += [f"in the wheel outside the package and {dist_info}: {n}" for n in sorted(other)]
        unexpected = {n for n in meta - DIST_INFO if not n.startswith("licenses/")}
        problems += [f"unexpected file in {dist_info}: {n}" for n in sorted(unexpected)]
        problems += [f"missing from {dist_info}: {n}" for n in sorted(DIST_INFO - meta)]
        if meta >= DIST_INFO:
            problems += _record_problems(zf, f"{dist_info}/RECORD", names)
            problems += _metadata_problems(zf, dist_info, project, version)
    return problems


def _record_problems(zf: zipfile.ZipFile, record: str, names: set[str]) -> list[str]:
    rows = {row[0]: row[1] for row in csv.reader(io.StringIO(zf.read(record).decode())) if row}
    problems = [f"RECORD lists {n}, not in the wheel" for n in sorted(set(rows) - names)]
    problems += [f"not in RECORD: {n}" for n in sorted(names - set(rows))]
    for name in sorted(names & set(rows) - {record}):
        digest = base64.urlsafe_b64encode(hashlib.sha256(zf.read(name)).digest()).rstrip(b"=").decode()
        if rows[name] != f"sha256={digest}":
            problems.append(f"RECORD's hash of {name} is not its content's")
    return problems


def _metadata_problems(zf: zipfile.ZipFile, dist_info: str, project: dict, version: str) -> list[str]:
    metadata = Parser().parsestr(zf.read(f"{dist_info}/METADATA").decode())
    found = {
        "Name": metadata["Name"],
        "Version": metadata["Version"],
        "Requires-Python": metadata["Requires-Python"],
        "Provides-Extra": sorted(metadata.get_all("Provides-Extra") or []),
        "Classifier": metadata.get_all("Classifier") or [],
    }
    wanted = {
        "Name": project["name"],
        "Version": version,
        "Requires-Python": project["requires-python"],
        "Provides-Extra": sorted(project.get("optional-dependencies", {})),
        "Classifier": project.get("classifiers", []),
    }
    differ = [k for k in wanted if found[k] != wanted[k]]
    problems = [f"METADATA {k}: {found[k]!r}, expected {wanted[k]!r}" for k in differ]
    scripts = configparser.ConfigParser(delimiters=("=",))
    scripts.optionxform = str  # type: ignore[assignment,method-assign]  # keep the script names' case
    scripts.read_string(zf.read(f"{dist_info}/entry_points.txt").decode())
    entry_points = {s: dict(scripts[s]) for s in scripts.sections()}
    wanted_scripts = {"console_scripts": {"lightning-resume": "lightning_resume.cli:main"}}
    if entry_points != wanted_scripts or project.get("scripts") != wanted_scripts["console_scripts"]:
        problems.append(f"entry points: {entry_points}, expected {wanted_scripts} (so in pyproject.toml)")
    wheel_tags = Parser().parsestr(zf.read(f"{dist_info}/WHEEL").decode())
    if wheel_tags["Root-Is-Purelib"] != "true" or wheel_tags.get_all("Tag") != ["py3-none-any"]:
        problems.append(f"WHEEL: {dict(wheel_tags)}, expected a pure-Python py3-none-any wheel")
    return problems


def sdist_problems(sdist: Path, expected: set[str], version: str) -> list[str]:
    """What is wrong with ``sdist``: a file of the package missing, or more than the package and what builds
    it."""
    top = f"{PACKAGE}-{version}"
    if sdist.name != f"{top}.tar.gz":
        return [f"{sdist.name}: expected {top}.tar.gz"]
    with tarfile.open(sdist) as tf:
        names = {m.name.removeprefix(f"{top}/") for m in tf.getmembers() if m.isfile()}
    problems = [f"missing from the sdist: {n}" for n in sorted(expected - names)]
    for name in sorted(names - expected):
        first = PurePosixPath(name).parts[0]
        if name not in SDIST_EXTRA and first != f"{PACKAGE}.egg-info":
            problems.append(f"in the sdist but neither the package nor what builds it: {name}")
    return problems


def wheel_differences(a: Path, b: Path) -> list[str]:
    """Files whose presence or bytes differ between two wheels (their zip timestamps aside)."""
    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        files_a, files_b = set(za.namelist()), set(zb.namelist())
        problems = [f"only in {a.parent.name}/{a.name}: {n}" for n in sorted(files_a - files_b)]
        problems += [f"only in {b.parent.name}/{b.name}: {n}" for n in sorted(files_b - files_a)]
        differ = [n for n in sorted(files_a & files_b) if za.read(n) != zb.read(n)]
        problems += [f"differs between the wheels: {n}" for n in differ]
    return problems


def _build(source: Path, out: Path, *what: str) -> Path:
    """``python -m build`` of ``source`` (a directory, or an sdist that it unpacks) into ``out``; the file
    it made."""
    out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "build", *what, "--outdir", str(out), str(source)]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stdout}{done.stderr}")
    (made,) = out.iterdir()
    return made


def file_list(wheel: Path) -> tuple[list[str], str]:
    """The wheel's files with their sizes, one a line, and a line of totals."""
    with zipfile.ZipFile(wheel) as zf:
        infos = [i for i in zf.infolist() if not i.is_dir()]
    total = sum(i.file_size for i in infos)
    summary = f"{wheel.name}: {wheel.stat().st_size} bytes, {len(infos)} files, {total} bytes unpacked"
    return [f"{i.file_size:>9}  {i.filename}" for i in infos], summary


def folders(wheel: Path) -> list[str]:
    """How many files and bytes each folder of the wheel holds, one a line."""
    counts: dict[str, list[int]] = {}
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            entry = counts.setdefault(str(PurePosixPath(info.filename).parent), [0, 0])
            entry[0], entry[1] = entry[0] + 1, entry[1] + info.file_size
    return [f"{n:>4} files {size:>8} bytes  {folder}/" for folder, (n, size) in sorted(counts.items())]


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else ROOT / "dist").resolve()
    version, expected = source_version(), package_files()
    shutil.rmtree(out, ignore_errors=True)
    # setuptools builds a checkout's wheel through build/: a module deleted since the last build stays there.
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        sdist = _build(ROOT, Path(tmp) / "sdist", "--sdist")
        wheel = _build(sdist, Path(tmp) / "from-sdist", "--wheel")  # what pip install of the sdist makes
        from_tree = _build(ROOT, Path(tmp) / "from-checkout", "--wheel")
        problems = wheel_problems(wheel, expected, version) + sdist_problems(sdist, expected, version)
        problems += wheel_differences(wheel, from_tree)
        out.mkdir(parents=True)
        sdist, wheel = Path(shutil.copy(sdist, out)), Path(shutil.copy(wheel, out))
    twine_argv = [sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)]
    twine = subprocess.run(twine_argv, capture_output=True, text=True)
    if twine.returncode != 0:
        problems.append(f"twine check --strict failed:\n{twine.stdout}{twine.stderr}")
    listing, summary = file_list(wheel)
    (out / "wheel-files.txt").write_text("\n".join([*listing, summary]) + "\n")
    print(f"{sdist.name}: {sdist.stat().st_size} bytes\n{summary}", *folders(wheel), sep="\n")
    print(f"the wheel's files, one a line: {out / 'wheel-files.txt'}")
    if problems:
        print("\n".join(f"FAILED: {p}" for p in problems), file=sys.stderr)
        return 1
    print(
        f"ok: the wheel holds the {len(expected)} files of {PACKAGE} {version} and its metadata only; the "
        "sdist builds the same wheel, byte for byte, as the checkout; twine check --strict passes"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
