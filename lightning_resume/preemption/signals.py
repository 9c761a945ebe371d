"""Signal facts as plain functions: who owns a handler, which signals preempt, known bad set-ups."""

from __future__ import annotations

import shutil
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lightning_resume._scheduler.environment import ENV, on_slurm, under_submitit

# SLURM/Kubernetes/torchrun stop with SIGTERM, SLURM's --signal=USR1@N warns with SIGUSR1, submitit with USR2.
PREEMPT_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2")
WATCHED_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGCONT")


@dataclass(frozen=True)
class HandlerInfo:
    """A handler for a log line: ``name`` (``module.qualname``, ``SIG_DFL``, ...) and ``origin`` (``default``,
    ``ignored``, ``lightning``, ``submitit``, ``torch elastic``, ``lightning_resume`` or ``user``)."""

    name: str
    origin: str

    def __str__(self) -> str:
        return f"{self.name} [{self.origin}]"


def full_name(name: str) -> str:
    """``usr1`` -> ``SIGUSR1`` (not checked)."""
    name = name.upper()
    return name if name.startswith("SIG") else f"SIG{name}"


def signal_number(name: str) -> signal.Signals:
    """``"SIGUSR1"`` or ``"USR1"`` -> ``signal.SIGUSR1``; ValueError for a name not a signal here."""
    if not isinstance(name, str):
        raise ValueError(f"Signals are given by name, such as 'SIGTERM' or 'SIGUSR1', got {name!r}.")
    try:
        return signal.Signals[full_name(name.strip())]
    except KeyError:
        raise ValueError(f"Unknown signal {name!r}; use a name such as 'SIGTERM' or 'SIGUSR1'.") from None


def catchable_signal(name: str) -> signal.Signals:
    """:func:`signal_number`, refusing SIGKILL and SIGSTOP (the kernel acts on them, no handler runs)."""
    sig = signal_number(name)
    if sig in (signal.SIGKILL, signal.SIGSTOP):
        raise ValueError(
            f"{sig.name} cannot be caught: the kernel kills or stops the process without running any "
            "handler, so nothing can be saved. Use the signal the scheduler sends first (SIGTERM, or the "
            "early warning of SLURM's --signal=USR1@N)."
        )
    return sig


def describe(handler: Any) -> HandlerInfo:
    """Who installed ``handler`` (a value returned by ``signal.getsignal``)."""
    if handler is None:
        return HandlerInfo("None (installed outside Python)", "user")
    if handler == signal.SIG_DFL:
        return HandlerInfo("SIG_DFL", "default")
    if handler == signal.SIG_IGN:
        return HandlerInfo("SIG_IGN", "ignored")
    if handler is signal.default_int_handler:
        return HandlerInfo("default_int_handler (KeyboardInterrupt)", "default")
    bound = getattr(handler, "__self__", None)
    qualname = getattr(handler, "__qualname__", None) or type(handler).__qualname__
    if bound is not None:
        module = type(bound).__module__
        qualname = f"{type(bound).__qualname__}.{getattr(handler, '__name__', qualname)}"
    else:
        module = str(getattr(handler, "__module__", "") or "")
    top = module.split(".")[0]
    if module.startswith("torch.distributed.elastic"):
        origin = "torch elastic"
    elif top in ("lightning", "pytorch_lightning", "lightning_fabric"):
        origin = "lightning"
    else:
        origin = top if top in ("submitit", "lightning_resume") else "user"
    return HandlerInfo(f"{module}.{qualname}", origin)


def handler_table(names: tuple[str, ...] = WATCHED_SIGNALS) -> dict[str, HandlerInfo]:
    return {name: describe(signal.getsignal(signal_number(name))) for name in names}


def submitit_signal(environ: Mapping[str, str]) -> str:
    """The signal submitit preempts with (``$SUBMITIT_PREEMPT_SIGNAL``, default USR2); ValueError for none."""
    value = environ.get(ENV["submitit_signal"], "USR2")
    try:
        return signal_number(value).name
    except ValueError:
        raise ValueError(
            f"{ENV['submitit_signal']}={value!r} names no signal: submitit expects a name without 'SIG', "
            "such as USR2. Fix or unset it in the job's environment."
        ) from None


def known_problems(
    table: Mapping[str, HandlerInfo], environ: Mapping[str, str], preemption_handler: bool = False
) -> list[str]:
    """Warnings, each with what to do, about the handlers in ``table`` (:func:`handler_table`) known to lose
    work or requeues; ``preemption_handler``: one is in use, even if its handlers are not installed now."""
    problems = []
    slurm = on_slurm(environ)
    ours = preemption_handler or any(info.origin == "lightning_resume" for info in table.values())
    usr1 = table.get("SIGUSR1")
    if slurm and usr1 and usr1.origin not in ("default", "lightning", "lightning_resume") and not ours:
        problems.append(
            f"SIGUSR1 already has a handler ({usr1}): Lightning's SLURM auto-requeue silently installs none. "
            "Add lightning_resume.PreemptionHandler to handle SLURM's time-limit signal."
        )
    term = table.get("SIGTERM")
    if slurm and term and term.origin == "default" and not ours:
        problems.append(
            "SIGTERM is at its default action under SLURM: a preemption kills the process with no checkpoint "
            "and no requeue. Add lightning_resume.PreemptionHandler to the Trainer's callbacks."
        )
    if term and term.origin == "ignored":
        problems.append(
            "SIGTERM is ignored (SIG_IGN): the scheduler's stop request goes unnoticed until SIGKILL. "
            "Add lightning_resume.PreemptionHandler, which handles it and restores SIG_IGN afterwards."
        )
    if slurm and shutil.which("scontrol") is None:
        problems.append(
            "'scontrol' is not on PATH: a requeue cannot be issued from this job. Fix PATH in the job script."
        )
    if slurm and not ours and under_submitit(environ):
        problems.append(
            "Under submitit a SIGTERM is only logged ('bypassed'); without PreemptionHandler a SIGTERM "
            "preemption ends the job with no checkpoint and no requeue."
        )
    return problems
