"""Preemption notices: warnings that come before the signal, for :class:`~lightning_resume.PreemptionHandler`.

A cloud tells a machine it is about to be reclaimed some time before it stops it (EC2 spot: two
minutes; Compute Engine: 30 seconds; Azure: 30 seconds or more), a SLURM job knows its end time, and a
Kubernetes ``preStop`` hook can create a file. ``PreemptionHandler(notices=...)`` polls these sources
off the training thread and saves ``last.ckpt`` before the signal (see ``on_notice``)::

    from lightning_resume.notices import AwsSpotNotice, FileNotice

    PreemptionHandler(notices=[AwsSpotNotice(), FileNotice("/tmp/preempted")])

``notices="auto"`` (the default) polls every source that applies on the machine; each tells without a
network call. A source's :meth:`~NoticeSource.poll` can also be called from a script of your own: it
returns a :class:`Notice` or ``None`` and never raises. Standard library only.
"""

from lightning_resume.preemption.notices._aws_spot_notice import AwsSpotNotice
from lightning_resume.preemption.notices._azure_notice import AzureNotice
from lightning_resume.preemption.notices._file_notice import FileNotice
from lightning_resume.preemption.notices._gce_notice import GceNotice
from lightning_resume.preemption.notices._notice import Notice
from lightning_resume.preemption.notices._notice_source import NoticeSource
from lightning_resume.preemption.notices._slurm_time_limit_notice import SlurmTimeLimitNotice

__all__ = [
    "AwsSpotNotice",
    "AzureNotice",
    "FileNotice",
    "GceNotice",
    "Notice",
    "NoticeSource",
    "SlurmTimeLimitNotice",
]
