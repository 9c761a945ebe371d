"""What the scheduler (``environment``, ``slurm``) and the machine (``machine``: which cloud) say about
this process. Standard library only."""
