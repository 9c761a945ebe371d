"""``lightning_resume`` for projects on the standalone ``pytorch_lightning`` package.

``import pytorch_lightning as pl`` projects use the same callbacks and plugin from here::

    import pytorch_lightning as pl
    from lightning_resume.pytorch_lightning import DurableCheckpointIO, RequeueCheckpoint, RunDir

    trainer = pl.Trainer(callbacks=[RunDir(), RequeueCheckpoint()], plugins=[DurableCheckpointIO()])

Every public name and module of :mod:`lightning_resume` is here (``...pytorch_lightning.loggers``, ...):
the same code, built on ``pytorch_lightning`` and ``lightning_fabric``. ``pytorch_lightning``'s Trainer
recognises callbacks and plugins by its own classes: take everything from one of the two, never a mix.
"""

from typing import Any

from lightning_resume import _standalone

_standalone.install()
_doc = __doc__
__all__ = _standalone.public_names(globals())
__doc__ = _doc
_lazy_names = globals()["__getattr__"]  # lightning_resume's own, rewritten: imports on first use


def __getattr__(name: str) -> Any:
    # Declared here for type checkers too: the names above are made at run time, typed as Any.
    return _lazy_names(name)
