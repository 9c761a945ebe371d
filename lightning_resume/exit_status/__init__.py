"""One exit status per failure class, the same on every rank: ``fit``'s exception classified (``classify``),
the root cause agreed through the run dir (``records``), the exit status set (``exit_hook``) by the private
callback ``PreemptionHandler`` and ``ProgressWatchdog`` put in (``exit_status``)."""
