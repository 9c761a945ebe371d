"""What happens when...: the command line.

Cases of the reliability catalogue (``tests/bad_inputs.py``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from bad_inputs import (
    Case,
    case,
    cases_of,
    cli,
    run_case,
)

from lightning_resume import (
    DurableCheckpointIO,
    RequeueCheckpoint,
)
from lightning_resume.run_dir import layout


@case(
    "`lightning-resume gc --apply` with a directory inside `.handoff`",
    "the directory is left alone; the rest of the plan is applied, no traceback",
)
def gc_with_a_directory_in_handoff(tmp_path: Path) -> None:
    handoff = tmp_path / "root" / layout.HANDOFF_DIR
    (tmp_path / "root" / layout.INDEX_DIR).mkdir(parents=True)
    (handoff / "a-dir").mkdir(parents=True)
    (handoff / "old").write_text("{}")
    os.utime(handoff / "old", (0, 0))
    os.utime(handoff / "a-dir", (0, 0))
    code, out, err = cli("gc", tmp_path / "root", "--older-than", "1d", "--apply", "--json")
    assert code == 0 and "Traceback" not in err, err
    assert [Path(r["path"]).name for r in json.loads(out)["removals"]] == ["old"]
    assert (handoff / "a-dir").is_dir()


@case(
    "`inspect` of a missing path, `gc` with a bad age, an unknown option",
    "one line on stderr and exit status 2",
)
def cli_usage_errors(tmp_path: Path) -> None:
    for args in (
        ("inspect", tmp_path / "nope"),
        ("gc", tmp_path, "--older-than", "soon"),
        ("inspect", "--bad"),
    ):
        code, _, err = cli(*args)
        assert code == 2 and len(err.strip().splitlines()) == 1, err


@case(
    '`dirpath="$TMPDIR/ckpt"` (RequeueCheckpoint or DurableCheckpointIO) with `TMPDIR` not set',
    "`ValueError` naming `$TMPDIR`, at construction; no folder called `$TMPDIR` is created",
)
def unset_variable_in_dirpath(tmp_path: Path) -> None:
    assert "LR_TEST_UNSET" not in os.environ
    cwd = os.getcwd()
    os.chdir(tmp_path)  # where a literal "$LR_TEST_UNSET" folder would appear
    try:
        for build in (
            lambda: RequeueCheckpoint(dirpath="$LR_TEST_UNSET/ckpt"),
            lambda: DurableCheckpointIO(dirpath="${LR_TEST_UNSET}/ckpt"),
        ):
            with pytest.raises(ValueError, match=r"uses \$LR_TEST_UNSET, which is not set"):
                build()
    finally:
        os.chdir(cwd)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("entry", cases_of(__name__), ids=lambda c: c.name)
def test_catalogue(entry: Case, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    run_case(entry, tmp_path, request)
