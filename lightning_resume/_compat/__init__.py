"""The one seam for other libraries' internals: every private name of Lightning, torch, torchmetrics and
torchdata, every monkeypatch and every match on their message texts, one module per library and one
named function per touch, each pinned against the installed version by ``tests/_compat``.
"""
