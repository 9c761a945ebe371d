"""The library version, kept in one place for ``pyproject.toml`` and ``run_meta.json``."""

__version__ = "0.1.0"
