"""``last.ckpt``: ``RequeueCheckpoint``, when it saves (``cadence``: fixed intervals and ``"auto"``),
the epoch boundary, the restart rule (``restart``) and the restart's redirect of the first load.
"""
