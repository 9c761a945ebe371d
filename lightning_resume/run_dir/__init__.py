"""The run dir: ``RunDir`` (which directory a launch gets, agreed by all its ranks), the records kept
there (``layout`` names every file), the launcher's configuration, and loads of the run's own checkpoints."""
