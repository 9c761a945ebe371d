"""Sharded checkpoints: directories saved by every rank, committed atomically, verified on restart.

Lightning calls no ``CheckpointIO`` for sharded saves, so ``RequeueCheckpoint`` hands them here:
``saver`` (``DirectorySaver``), ``parts`` (what each rank wrote, the manifest, the commit; torch-free),
``choice`` (the verified choice of a restart), ``dcp`` (what a DCP checkpoint holds) and ``stager``
(host buffers for asynchronous saves). Storage itself is ``lightning_resume._storage``.
"""
