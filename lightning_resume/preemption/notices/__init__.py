"""The preemption notice sources and their poller; public as :mod:`lightning_resume.notices`."""
