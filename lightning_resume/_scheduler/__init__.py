"""What the job's scheduler and machine say about this process, shared by the features.

``environment`` (every variable read, in one table: the session key, restart, ranks, the launch key),
``slurm`` (the SLURM commands a job runs on itself) and ``machine`` (which cloud, from the firmware's
strings). Standard library only.
"""
