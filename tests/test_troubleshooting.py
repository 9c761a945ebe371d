"""The troubleshooting page lists every case of the reliability catalogue, and each case once.

The cases (``@case(given, outcome)``) are spread over ``tests/<feature>/test_*_bad_inputs.py``; they
are read from the source here, so this test needs none of them imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PAGE = TESTS.parent / "docs" / "src" / "troubleshooting.md"


def cases() -> list[tuple[str, str, str]]:
    """``(name, given, outcome)`` of every case, in every catalogue module."""
    found = []
    for path in sorted(TESTS.glob("*/test_*_bad_inputs.py")):
        for node in ast.parse(path.read_text()).body:
            for decorator in getattr(node, "decorator_list", []):
                if isinstance(decorator, ast.Call) and getattr(decorator.func, "id", None) == "case":
                    given, outcome = (ast.literal_eval(arg) for arg in decorator.args)
                    found.append((f"{path.stem}::{node.name}", given, outcome))  # type: ignore[attr-defined]
    return found


def test_the_catalogue_is_spread_over_the_features() -> None:
    assert len(cases()) >= 90
    assert len({Path(name.split("::")[0]).stem for name, _, _ in cases()}) >= 7


def test_the_troubleshooting_page_lists_every_case() -> None:
    page = " ".join(PAGE.read_text().split())
    missing = [name for name, given, outcome in cases() if f"| {given} | {outcome} |" not in page]
    assert not missing, f"docs/src/troubleshooting.md has no row '| given | outcome |' for {missing}"


def test_every_case_is_one_of_a_kind() -> None:
    names = [name.split("::")[1] for name, _, _ in cases()]
    givens = [given for _, given, _ in cases()]
    assert len(set(names)) == len(names) and len(set(givens)) == len(givens)
