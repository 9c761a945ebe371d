"""The checkpoint writer: everything that runs in the writer process, and nothing that imports torch.

Atomic files, manifests, commits, the catalog of committed checkpoints, direct (``O_DIRECT``) file
writes, the zip records of a ``torch.save`` archive, the writer's two speeds (``duty_cycle``), the
durable write-speed probe (``write_speed``), and the writer process itself. Standard library
(plus ``xxhash`` and, when installed, ``isal``) only: the writer process starts in tens of
milliseconds and costs little memory. ``tests/writer/test_boundary.py`` imports this package in a
fresh interpreter and checks that neither torch nor lightning is loaded.
"""
