"""A Griffe extension for the API pages: the reST bits in our Google-style docstrings, as Markdown.

- ``:class:`~lightning_resume.RunDir``` (any role) becomes a cross-reference link to the documented
  object when the target is public ``lightning_resume`` API, and inline code otherwise. A link to a
  public object that has no API page fails ``mkdocs build --strict``.
- ```text <url>`_`` links become Markdown links.
- ``Example::`` followed by an indented block becomes an ``Example:`` section holding a fenced
  Python block (Griffe would otherwise render the code as running text).
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|data|exc|mod|obj):`(~?)([\w.]+)(\(\))?`")
_LINK = re.compile(r"`([^`<]+?)\s*<([^>`]+)>`__?")
_EXAMPLE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<title>Examples?)::[ \t]*\n(?P<body>(?:[ \t]*\n|(?P=indent)[ \t]+\S.*\n?)+)", re.M
)


def _role(match: re.Match[str]) -> str:
    short, target, call = match.group(1), match.group(2), match.group(3) or ""
    shown = (target.rsplit(".", 1)[-1] if short else target) + call
    parts = target.split(".")
    if parts[0] == "lightning_resume" and len(parts) > 1 and not any(p.startswith("_") for p in parts):
        return f"[`{shown}`][{target}]"  # public API: a link to its API page
    return f"`{shown}`"


def _example(match: re.Match[str]) -> str:
    indent, title = match.group("indent"), match.group("title")
    code = textwrap.dedent(match.group("body")).strip("\n")
    fenced = textwrap.indent(f"```python\n{code}\n```", indent + "    ")
    return f"{indent}{title}:\n{fenced}\n\n"


def convert(text: str) -> str:
    """The docstring ``text`` with reST roles and ``Example::`` blocks turned into Markdown."""
    return _LINK.sub(r"[\1](\2)", _ROLE.sub(_role, _EXAMPLE.sub(_example, text)))


class RstRoles(griffe.Extension):
    """Rewrite every docstring of the loaded package before it is parsed."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = convert(obj.docstring.value)
