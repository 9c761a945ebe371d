"""Exact resume: the random and data state saved with every checkpoint and put back at its moment, by the
private callback ``ExactResume`` that ``RequeueCheckpoint`` puts in the Trainer."""
