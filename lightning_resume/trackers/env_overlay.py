"""``EnvOverlay``: environment variables set for a while and put back exactly as they were (the library
sets one only where a documented variable is the one way to tell a component before it starts)."""

from __future__ import annotations

import os


class EnvOverlay:
    """Variables set in ``os.environ`` by one owner; :meth:`restore` undoes them."""

    def __init__(self) -> None:
        self._before: dict[str, str | None] = {}

    def set(self, name: str, value: str) -> None:
        """Set ``name``, remembering its value before the first change."""
        self._before.setdefault(name, os.environ.get(name))
        os.environ[name] = value

    def restore(self) -> None:
        """Put every variable back as it was (unset when it was unset)."""
        for name, value in self._before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._before.clear()
