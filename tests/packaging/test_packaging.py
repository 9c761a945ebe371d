"""Packaging: the wheel check catches what a wheel must not miss or hold, one version everywhere, the
declared Pythons are the tested ones, and the per-Python runner finds interpreters where users keep them.

``make test-wheel`` and ``make test-pythons`` run the checks themselves; these tests show that the checks
catch what they are for.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from check_dist import ROOT, package_files, project_table, source_version, wheel_differences, wheel_problems
from pythons import declared, find

import lightning_resume
from lightning_resume._compat import versions
from lightning_resume.cli import main
from lightning_resume.cli.doctor import version_checks


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of the checkout's package and what builds it (no network: the venv's
    setuptools)."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "MANIFEST.in"):
        shutil.copy(ROOT / name, source)
    for name in package_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    argv = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(source)]
    subprocess.run(argv, check=True, capture_output=True)
    (built,) = out.glob("*.whl")
    return built


def _rewritten(wheel: Path, to: Path, drop: str = "", add: dict[str, str] | None = None) -> Path:
    """A copy of ``wheel`` without ``drop`` and with ``add`` (name -> text) written over or beside."""
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(to, "w") as dst:
        for info in src.infolist():
            if info.filename != drop and info.filename not in (add or {}):
                dst.writestr(info, src.read(info))
        for name, text in (add or {}).items():
            dst.writestr(name, text)
    return to


def test_the_built_wheel_holds_the_package_and_its_metadata_only(wheel: Path) -> None:
    assert wheel_problems(wheel, package_files(), source_version()) == []
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert {"lightning_resume/py.typed", "lightning_resume/cli/__init__.py"} <= names
    assert not [n for n in names if n.startswith("tests/") or "__pycache__" in n]


def test_the_wheel_check_names_a_missing_module_stray_files_and_a_second_script(
    wheel: Path, tmp_path: Path
) -> None:
    expected, version = package_files(), source_version()
    dist_info = f"lightning_resume-{version}.dist-info"

    def problems(**change: object) -> str:
        bad = _rewritten(wheel, tmp_path / wheel.name, **change)  # type: ignore[arg-type]
        return "\n".join(wheel_problems(bad, expected, version))

    doctor = "lightning_resume/cli/doctor.py"
    assert f"missing from the wheel: {doctor}" in problems(drop=doctor)
    typed = "missing from the wheel: lightning_resume/py.typed (not a module: add it to [tool.setuptools."
    assert typed in problems(drop="lightning_resume/py.typed")
    stray = problems(add={"tests/conftest.py": "", "lightning_resume/__pycache__/x.cpython-311.pyc": ""})
    assert "outside the package" in stray and "tests/conftest.py" in stray
    assert "not a file of the package: lightning_resume/__pycache__/x.cpython-311.pyc" in stray
    scripts = "[console_scripts]\nlightning-resume = lightning_resume.cli:main\nother = x:y\n"
    assert "entry points" in problems(add={f"{dist_info}/entry_points.txt": scripts})
    assert "RECORD's hash of lightning_resume/_version.py" in problems(
        add={"lightning_resume/_version.py": '__version__ = "9.9.9"\n'}
    )


def test_wheels_that_differ_by_one_file_are_told_apart(wheel: Path, tmp_path: Path) -> None:
    assert wheel_differences(wheel, wheel) == []
    other = _rewritten(wheel, tmp_path / wheel.name, add={"lightning_resume/notices.py": "# changed\n"})
    assert wheel_differences(wheel, other) == ["differs between the wheels: lightning_resume/notices.py"]


def test_one_version_in_the_module_the_metadata_the_cli_and_doctor(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert lightning_resume.__version__ == source_version()
    assert importlib.metadata.version("lightning-resume") == lightning_resume.__version__
    dynamic = 'version = { attr = "lightning_resume._version.__version__" }'
    assert dynamic in (ROOT / "pyproject.toml").read_text()
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"lightning-resume {lightning_resume.__version__}"
    (found,) = [f for f in version_checks() if f.check == "lightning-resume"]
    assert found.detail.startswith(f"{lightning_resume.__version__}, imported from ")


def test_the_declared_pythons_are_the_tested_range() -> None:
    lowest, newest = versions.PYTHON
    tested = [f"3.{minor}" for minor in range(int(lowest[2:]), int(newest[2:]) + 1)]
    assert declared() == tested
    assert f'requires-python = ">={lowest}"' in (ROOT / "pyproject.toml").read_text()
    assert f"Python {lowest} to {newest}" in (ROOT / "README.md").read_text()


def test_the_readme_installs_from_a_checkout_or_a_wheel_and_names_every_extra() -> None:
    install = (ROOT / "README.md").read_text().split("## Install", 1)[1].split("\n## ", 1)[0]
    # Not on PyPI yet: `pip install lightning-resume` would find nothing, or someone else's package.
    assert "pip install lightning-resume" not in install and "pip install ." in install
    assert "pip install dist/*.whl" in install
    missing = [extra for extra in project_table()["optional-dependencies"] if f"`{extra}`" not in install]
    assert not missing, f"the README's Install section does not say what these extras bring: {missing}"


def test_doctor_warns_on_a_python_newer_than_the_newest_tested(monkeypatch: pytest.MonkeyPatch) -> None:
    (ok,) = [f for f in version_checks() if f.check == "python"]
    assert ok.level.value == "ok"
    monkeypatch.setattr(versions, "PYTHON", ("3.8", "3.9"))
    (newer,) = [f for f in version_checks() if f.check == "python"]
    assert newer.level.value == "warn" and "is newer than the newest tested, 3.9" in newer.detail
    assert "3.8 to 3.9" in newer.hint


def test_pythons_are_found_in_pyenvs_versions_folder_newest_patch_first(tmp_path: Path) -> None:
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for name in (f"{version}.1", f"{version}.12", f"{version}.13t", f"{version}-dev"):
        (tmp_path / "versions" / name / "bin").mkdir(parents=True)
        (tmp_path / "versions" / name / "bin" / "python").symlink_to(sys.executable)
    environ = {"PYENV_ROOT": str(tmp_path), "PATH": ""}
    assert find(version, environ) == (str(tmp_path / "versions" / f"{version}.12" / "bin" / "python"), "")
    interpreter, why = find("3.99", environ)
    assert interpreter is None
    assert why.startswith("not found in pyenv's versions folder (3.99.N) and python3.99 on the PATH")
