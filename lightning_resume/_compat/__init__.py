"""The one seam for other libraries' internals: every private name, monkeypatch and message match of
Lightning, torch, torchmetrics and torchdata, one module per library and one named function per touch,
each pinned by ``tests/_compat``."""
