"""Where a run lives and what the scheduler says: layout, session and restart, run-dir resolution,
the process-level binding, status records, tracker sidecars, signal facts and SLURM commands. Plain
functions over paths and environment mappings; no Lightning.
"""
