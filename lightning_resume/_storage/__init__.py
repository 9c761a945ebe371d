"""Checkpoint storage: one model for checkpoint files and checkpoint directories, local and remote.

``kinds`` says what differs between a file and a directory; the rest is written once for both:
``manifest``, ``store`` (a local folder and an fsspec URL behind one protocol), ``catalog``
(committed, verified, fallback order, retention), ``commit``, ``cleanup`` (leftovers of interrupted
saves), ``mirror`` + ``background``, ``atomic`` (every file the library writes) and ``direct_file``.
Torch-free (the writer process imports it; ``tests/writer/test_boundary.py`` checks).
"""
