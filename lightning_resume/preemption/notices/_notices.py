"""``Notices``: which preemption notices ``PreemptionHandler`` polls and what it does about them."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from lightning_resume._checks import positive_number
from lightning_resume.preemption.notices._aws_spot_notice import AwsSpotNotice
from lightning_resume.preemption.notices._azure_notice import AzureNotice
from lightning_resume.preemption.notices._file_notice import FileNotice
from lightning_resume.preemption.notices._gce_notice import GceNotice
from lightning_resume.preemption.notices._notice_source import NoticeSource
from lightning_resume.preemption.notices._policy import ON_NOTICE
from lightning_resume.preemption.notices._slurm_time_limit_notice import SlurmTimeLimitNotice

#: Where users import the sources: lightning_resume.notices, or its pytorch_lightning mirror.
_PACKAGE = __name__.rsplit(".", 1)[0].replace(".preemption.notices", ".notices")


@dataclass(frozen=True)
class Notices:
    """The preemption notices of a :class:`~lightning_resume.PreemptionHandler` (``notices=``), polled off
    the training thread and acted on by every rank at the same step.

    Args:
        sources: ``"auto"`` (every source of :mod:`lightning_resume.notices` that applies on the machine,
            told without a network call), a list such as ``[AwsSpotNotice(), FileNotice("/tmp/x")]`` (or
            one source), or ``None``/``[]`` for none.
        on_notice: ``"save_and_continue"`` saves ``last.ckpt`` now and trains on until the deadline less
            the measured time to durable, ``margin`` and one step (or the signal), then stops as for a
            signal; ``"stop"``, or no room for that, saves, requeues and exits now.
        margin: Seconds kept free before a notice's deadline, beyond the measured time to durable and
            one step (time to requeue and exit, clocks that differ).

    Raises:
        ValueError: an unknown ``sources`` or ``on_notice`` string, or a ``margin`` not above 0.
        TypeError: ``sources`` that are not notice sources, or a ``margin`` that is not a number.

    Example::

        from lightning_resume.notices import AwsSpotNotice, FileNotice, Notices

        PreemptionHandler(notices=Notices([AwsSpotNotice(), FileNotice("/tmp/preempted")], margin=30))
        PreemptionHandler(notices=None)  # no notices
    """

    sources: Literal["auto"] | list[NoticeSource] | None = "auto"
    on_notice: Literal["save_and_continue", "stop"] = "save_and_continue"
    margin: float = 15.0

    def __post_init__(self) -> None:
        sources: Any = [self.sources] if isinstance(self.sources, NoticeSource) else self.sources
        if isinstance(sources, str) and sources != "auto":
            raise ValueError(
                f"Notices sources must be 'auto', None or a list of notice sources, got {sources!r}: e.g. "
                "Notices([AwsSpotNotice()]) from lightning_resume.notices."
            )
        if sources is not None and not isinstance(sources, str):
            if not isinstance(sources, Sequence) or not all(isinstance(s, NoticeSource) for s in sources):
                raise TypeError(
                    f"Notices sources must be 'auto', None or a list of notice sources from {_PACKAGE} "
                    f"(AwsSpotNotice(), GceNotice(), ...), got {sources!r}."
                )
            sources = list(sources)
        if self.on_notice not in ON_NOTICE:
            raise ValueError(
                f"Notices on_notice must be one of {', '.join(map(repr, ON_NOTICE))}, got {self.on_notice!r}."
            )
        margin = positive_number("Notices margin", self.margin, "number of seconds")
        object.__setattr__(self, "sources", sources)
        object.__setattr__(self, "margin", margin)

    @property
    def auto(self) -> bool:
        """Whether the sources are ``"auto"``'s (each polled only where it applies, silently)."""
        return self.sources == "auto"

    def resolved(self) -> list[NoticeSource]:
        """The sources as a list: ``"auto"`` gives a new one of each kind."""
        if isinstance(self.sources, str):
            return [AwsSpotNotice(), GceNotice(), AzureNotice(), SlurmTimeLimitNotice(), FileNotice()]
        return list(self.sources or [])


def as_notices(notices: Any, on_notice: str | None, margin: float | None) -> Notices | None:
    """``PreemptionHandler``'s ``notices`` as a ``Notices``, also from 0.x's flat arguments (warning)."""
    flat = not isinstance(notices, Notices) and (
        notices == "auto" or isinstance(notices, (list, tuple, NoticeSource))
    )
    if notices is not None and not flat and not isinstance(notices, Notices):
        raise TypeError(
            f"notices must be Notices(...) from {_PACKAGE}, or None, got {notices!r}: e.g. "
            "notices=Notices([AwsSpotNotice()])."
        )
    if not flat and on_notice is None and margin is None:
        return notices
    warnings.warn(
        "PreemptionHandler(notices=[...]/'auto', on_notice=, notice_margin=) will go: pass "
        "notices=Notices(sources, on_notice=..., margin=...) from lightning_resume.notices.",
        FutureWarning,
        stacklevel=3,
    )
    base = notices if isinstance(notices, Notices) else Notices(sources=notices)
    margin = base.margin if margin is None else margin
    return replace(base, on_notice=on_notice or base.on_notice, margin=margin)  # type: ignore[arg-type]
