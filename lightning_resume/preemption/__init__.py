"""Preemption: ``PreemptionHandler``, ``SignalDiagnostics``, the grace window, and the notices that come
before the signal (``notices``, public as ``lightning_resume.notices``)."""
