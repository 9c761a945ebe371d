"""``SlurmTimeLimitNotice``: the SLURM job's end time, so that the job requeues itself before its limit."""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Mapping

from lightning_resume._scheduler.environment import ENV
from lightning_resume._scheduler.slurm import slurm_output
from lightning_resume.preemption.grace import SlurmSignal, slurm_signal
from lightning_resume.preemption.notices._notice import TIME_LIMIT, Notice, format_time, parse_local_time
from lightning_resume.preemption.notices._notice_source import NoticeSource

log = logging.getLogger(__name__)

#: Seconds an empty accounting record is read again, before the job counts as without ``--signal``.
SIGNAL_READ_SECONDS = 60.0
UNSETTLED_POLL_SECONDS = 5.0  # between polls until the job's --signal is known


def parse_end_time_variable(value: str) -> float | None:
    """``$SLURM_JOB_END_TIME`` (SLURM >= 23.02): seconds since the epoch, ``None`` for 0 or less (no end)."""
    seconds = int(value.strip())
    return float(seconds) if seconds > 0 else None


def parse_scontrol_end_time(text: str) -> float | None:
    """``EndTime=`` in ``scontrol show job`` output (local time); ``None`` when unlimited (``Unknown``)."""
    found = re.search(r"(?:^|\s)EndTime=(\S+)", text)
    if found is None:
        raise ValueError(f"no EndTime in scontrol's answer {text[:200]!r}")
    value = found.group(1)
    return None if value in ("Unknown", "None", "N/A") else parse_local_time(value)


class SlurmTimeLimitNotice(NoticeSource):
    """The SLURM job's time limit, as a notice whose deadline is the job's end time.

    The end time comes from ``$SLURM_JOB_END_TIME`` (SLURM 23.02 and later), else from ``scontrol show
    job`` (``EndTime=``), read every ``interval`` seconds (the limit can change while the job runs).
    :class:`~lightning_resume.PreemptionHandler` saves nothing when it first sees this notice: when the
    end time less the measured time to durable, a margin and one step comes, it saves ``last.ckpt``,
    requeues the job and exits, before SLURM kills it at its limit. Applies in a SLURM job; job-wide
    (global rank 0 polls it). A job without a time limit, or submitted with ``--signal`` (SLURM's own
    warning, as submitit's jobs are), gets no notice. Until the accounting record tells whether there is
    a ``--signal`` (up to :data:`SIGNAL_READ_SECONDS` on a busy ``slurmdbd``), the limit counts: the
    notice is taken back if one shows up, and when the limit is removed.

    Args:
        interval: Seconds between two reads of the end time.
        timeout: Seconds to wait for ``scontrol``.

    Raises:
        TypeError: ``interval`` or ``timeout`` is not a number.
        ValueError: ``interval`` or ``timeout`` is not positive.

    Example::

        PreemptionHandler(notices=Notices([SlurmTimeLimitNotice()]))  # with #SBATCH --requeue --time=...
    """

    name = "slurm-time-limit"
    scope = "job"
    standing = False  # the end time can change, and a --signal found late takes the notice back

    def __init__(self, interval: float = 60.0, timeout: float = 5.0) -> None:
        super().__init__(interval=interval, timeout=timeout)
        self._signal: SlurmSignal | bool | None = False  # the job's --signal, once settled (False: not yet)
        self._first_read = 0.0

    def applies(self) -> bool:
        """In a SLURM job."""
        return bool(os.environ.get(ENV["slurm_job"]))

    def end_time(self, environ: Mapping[str, str] | None = None) -> float | None:
        """The job's end time (seconds since the epoch), ``None`` without a time limit or outside SLURM;
        ValueError when ``scontrol`` is missing or fails, or its answer is unreadable."""
        env = os.environ if environ is None else environ
        variable = env.get(ENV["slurm_end_time"], "").strip()
        if variable:
            return parse_end_time_variable(variable)
        job = env.get(ENV["slurm_job"], "").strip()
        if not job:
            return None
        answer = slurm_output(["scontrol", "-o", "show", "job", job], timeout=self.timeout)
        if answer is None:
            raise ValueError(f"'scontrol show job {job}' failed, is missing from PATH or gave no answer")
        return parse_scontrol_end_time(answer)

    @property
    def signal_known(self) -> bool:
        """Whether the job's ``--signal`` (or that it has none) is known: see :meth:`warning_signal`."""
        return self._signal is not False

    def warning_signal(self) -> SlurmSignal | None:
        """The job's ``--signal`` (``sacct``'s submit line, ``$SBATCH_SIGNAL``, the batch script), read again
        while a new job's accounting record is still empty (up to :data:`SIGNAL_READ_SECONDS`)."""
        if self._signal is not False:
            return self._signal if isinstance(self._signal, SlurmSignal) else None
        job = os.environ.get(ENV["slurm_job"], "").strip()
        accounting = ["sacct", "-X", "-j", job, "-o", "SubmitLine%1000", "-P", "-n"]
        submit = slurm_output(accounting, self.timeout) if job else None
        script = slurm_output(["scontrol", "write", "batch_script", job, "-"], self.timeout) if job else None
        try:
            found = slurm_signal(os.environ, submit, script)
        except ValueError:  # an $SBATCH_SIGNAL sbatch would refuse: no signal was set up
            found = None
        self._first_read = self._first_read or time.monotonic()
        recorded = submit is None or bool(submit.strip())  # no accounting at all, or the job's record
        if found is not None or recorded or time.monotonic() - self._first_read > SIGNAL_READ_SECONDS:
            self._signal = found
            if found is not None:
                name = found.name.removeprefix("SIG")
                log.info(
                    "job %s warns itself with --signal=%s@%g: no time-limit notice", job, name, found.lead
                )
        return found

    def _next_poll_in(self) -> float:  # soon while the --signal is unknown: the record comes within seconds
        return min(self.interval, UNSETTLED_POLL_SECONDS) if self._signal is False else self.interval

    def _poll(self, now: float) -> Notice | None:
        end = self.end_time()
        if end is None or self.warning_signal() is not None:
            return None  # no limit, or SLURM's own warning
        # Also while the --signal is not known yet: better requeued before the limit than killed at it.
        return Notice(self.name, TIME_LIMIT, end, detail=f"the job ends at {format_time(end)}", received=now)
