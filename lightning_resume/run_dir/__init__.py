"""The run dir: ``RunDir``, which directory a launch gets and how all its ranks agree on it, and the
records kept there (``layout`` names every file; ``status``, ``attempts``, ``hangs``), the LightningCLI
and Hydra configuration, and the run's own checkpoints loaded with their hyperparameters.
"""
