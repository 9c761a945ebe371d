"""The checkpoint writer process and what it runs, without torch or Lightning: it starts in tens of
milliseconds."""
