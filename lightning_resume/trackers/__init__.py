"""Tracker resume: a restarted job continues the tracker run of its first attempt.

One base, :class:`TrackerResume`, owns the hooks; each tracker's callback says how to read its run
identity and how to hand it back. :class:`LocalLoggerResume` does the same for Lightning's
TensorBoard and CSV loggers. Importing this package imports no tracker.
"""
