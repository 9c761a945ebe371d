"""The checkpoint writer process, and nothing that imports torch.

The process itself and its entry script (``process``, ``main``), the zip records of a ``torch.save``
archive (``zip_records``), the writer's two speeds (``duty_cycle``) and the durable write-speed probe
(``write_speed``). Files are committed through ``lightning_resume._storage``. Standard library (plus
``xxhash`` and, when installed, ``isal``) only: the writer process starts in tens of milliseconds and
costs little memory. ``tests/writer/test_boundary.py`` imports this package in a fresh interpreter and
checks that neither torch nor lightning is loaded.
"""
