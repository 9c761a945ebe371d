"""The checkpoint writer process, and nothing that imports torch: ``process`` and its script ``main``,
``zip_records`` (a ``torch.save`` archive), ``duty_cycle`` (its two speeds), ``write_speed`` (a probe).
Standard library, ``xxhash`` and optionally ``isal``: it starts in tens of milliseconds
(``tests/writer/test_boundary.py`` checks that neither torch nor lightning is loaded).
"""
