"""Checkpoint storage, one model for checkpoint files and directories, local and remote (``kinds`` says
what differs). Torch-free: the writer process imports it."""
