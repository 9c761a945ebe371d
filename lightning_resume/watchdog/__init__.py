"""``ProgressWatchdog``: a watchdog thread per rank (``monitor``), learned timeouts per section
(``timeouts``), what a hung rank does (``action``) and the crash-loop rule.
"""
