"""Tracker resume: a restarted job continues the tracker run (or TensorBoard/CSV logs) of its first
attempt. Importing this package imports no tracker."""
