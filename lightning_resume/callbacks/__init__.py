"""The callbacks: where the run lives, ``last.ckpt`` and resume, preemption signals, hangs, diagnostics."""

from lightning_resume.callbacks.preemption_handler import PreemptionHandler
from lightning_resume.callbacks.progress_watchdog import ProgressWatchdog
from lightning_resume.callbacks.requeue_checkpoint import RequeueCheckpoint
from lightning_resume.callbacks.run_dir import RunDir
from lightning_resume.callbacks.signal_diagnostics import SignalDiagnostics

__all__ = ["PreemptionHandler", "ProgressWatchdog", "RequeueCheckpoint", "RunDir", "SignalDiagnostics"]
