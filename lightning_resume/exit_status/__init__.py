"""One exit status per failure class, the same on every rank: ``fit``'s exception classified (``classify``),
the root cause shared through the run dir (``records``), the process's exit status set from it
(``exit_hook``) by the private callback ``PreemptionHandler`` and ``ProgressWatchdog`` put in
(``exit_status``)."""
