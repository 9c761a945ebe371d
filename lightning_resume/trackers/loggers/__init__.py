"""Lightning loggers shipped by lightning_resume; public as :mod:`lightning_resume.loggers`."""
