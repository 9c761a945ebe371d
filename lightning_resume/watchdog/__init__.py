"""``ProgressWatchdog`` and its parts: the thread, timeouts, what a hung rank does, the crash-loop rule."""
