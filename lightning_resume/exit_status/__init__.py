"""One exit status per failure class, the same on every rank: ``fit``'s exception classified (``classify``),
the root cause agreed (``records``), the status set (``exit_hook``) by the callback in ``exit_status``."""
