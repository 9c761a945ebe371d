"""``last.ckpt``: ``RequeueCheckpoint``, when it saves (``cadence``: steps or minutes, and the one save
timer; ``auto_cadence``: ``"auto"``), the epoch boundary, the restart rule (``restart``), the restart's
redirect of the first load, and what ``PreemptionHandler`` may ask of it (``stop_saves``).
"""
