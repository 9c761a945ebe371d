"""Checkpoint storage: one model for checkpoint files and checkpoint directories, local and remote.

The bottom layer of the package. ``kinds`` says what differs between a file and a directory; the
rest is written once for both: ``manifest`` (the two manifest formats, one header check),
``store`` (a local folder and an fsspec URL behind one protocol), ``catalog`` (committed, verified,
fallback order, retention), ``commit`` (commit, remove, prune), ``cleanup`` (leftovers of interrupted
saves), ``mirror`` (one upload path, one restore path, one background queue), plus ``atomic`` (the
atomic-write rule for every file the library writes) and ``direct_file`` (writes past the page cache).

Standard library (plus ``xxhash``, and ``fsspec`` for a mirror) only: the writer process imports it.
``tests/writer/test_boundary.py`` checks that importing it loads neither torch nor lightning.
"""
