"""Sharded checkpoints: directories saved by every rank, committed atomically, verified on restart.

Lightning calls no ``CheckpointIO`` for sharded saves and loads, so ``RequeueCheckpoint`` hands them
here: ``saver`` (``DirectorySaver``: every rank writes a fresh directory, synchronously or with
``dcp.async_save``; rank 0 commits and mirrors), ``parts`` (what each rank wrote, the manifest, the
commit; torch-free), ``choice`` (the verified choice of a restart, and its fallback), ``dcp`` (what a
strategy's DCP checkpoint holds) and ``stager`` (host buffers reused by asynchronous saves). Storage
itself (commit, verify, retention, mirror) is ``lightning_resume._storage``, the same as for files.
"""
