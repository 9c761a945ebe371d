"""Preemption notices: warnings that come before the signal, for :class:`~lightning_resume.PreemptionHandler`.

``PreemptionHandler(notices=Notices(...))`` polls these sources off the training thread and saves
``last.ckpt`` before the signal (``Notices()``, the default: every source that applies here)::

    from lightning_resume.notices import AwsSpotNotice, FileNotice, Notices

    PreemptionHandler(notices=Notices([AwsSpotNotice(), FileNotice("/tmp/preempted")]))

:meth:`NoticeSource.poll` also works from a script: it returns a :class:`Notice` or ``None``, never raising.
"""

from lightning_resume.preemption.notices._aws_spot_notice import AwsSpotNotice
from lightning_resume.preemption.notices._azure_notice import AzureNotice
from lightning_resume.preemption.notices._file_notice import FileNotice
from lightning_resume.preemption.notices._gce_notice import GceNotice
from lightning_resume.preemption.notices._notice import Notice
from lightning_resume.preemption.notices._notice_source import NoticeSource
from lightning_resume.preemption.notices._notices import Notices
from lightning_resume.preemption.notices._slurm_time_limit_notice import SlurmTimeLimitNotice

__all__ = [
    "AwsSpotNotice",
    "AzureNotice",
    "FileNotice",
    "GceNotice",
    "Notice",
    "NoticeSource",
    "Notices",
    "SlurmTimeLimitNotice",
]
