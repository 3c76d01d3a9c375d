"""Trials that cannot start: a sweep ends early, in one line, instead of failing every trial.

A trial that fails before its first evaluation on every attempt (Tune's retries included) met
something every other trial will meet too: a task module the workers cannot import, a data
path they cannot read. Running the rest would cost each of them its retries and print a
traceback each (a sweep on a cluster without the user's module: 329 lines, 113 s, exit 0).
"""

from __future__ import annotations

import errno
import os
import re
import signal
from pathlib import Path
from typing import Any, ClassVar

from ray import tune

from schedule_search.core.states import State
from schedule_search.store.experiment import Experiment

__all__ = [
    "FailFast",
    "TrialsFailed",
    "error_line",
    "raise_if_trials_cannot_run",
    "unwritable_path",
]

_EXCEPTION_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(Error|Exception|Exit)): ")
#: An OSError's line for a volume that has no room (ENOSPC, EDQUOT) or takes no writes
#: (EROFS), and the path it names.
_STORAGE_ERROR = re.compile(
    rf"\[Errno ({errno.ENOSPC}|{errno.EDQUOT}|{errno.EROFS})\] [^:]+: '(?P<path>[^']+)'"
)


def error_line(error_file: str | Path | None) -> str:
    """The root cause's one line in a Tune trial's error file: the first exception line (the
    innermost cause comes first in the worker's traceback that Ray Train forwards)."""
    if not error_file:
        return "error"
    try:
        lines = Path(error_file).read_text(errors="replace").splitlines()
    except OSError:
        return str(error_file)
    for line in lines:
        if _EXCEPTION_LINE.match(line) and "ray." not in line.split(":")[0]:
            return line.strip()
    lines = [line.strip() for line in lines if line.strip()]
    return lines[-1] if lines else "error"


def unwritable_path(line: str, folder: Path) -> bool:
    """Whether the error `line` is a full or read-only volume refusing a write inside
    `folder`. A retry of the trial meets the same volume, so it cannot succeed until someone
    makes room; one on another node's disk (a worker's staging folder) may, elsewhere."""
    found = _STORAGE_ERROR.search(line)
    return found is not None and Path(found["path"]).is_relative_to(folder)


class FailFast(tune.Stopper):
    """Ends the Tune run once a trial could not start (`stop`), the way Ctrl-C ends it: through
    Tune's graceful stop (its SIGUSR1 handler), so its state is saved with the other trials
    still running and the searcher still searching, and a `resume` after the cause is fixed
    runs them. As a `tune.Stopper` it stops the run only where Tune has no such handler
    (`fit()` outside the main thread): `stop_all` ends the other trials as TERMINATED and the
    searcher as finished, and a restored Tune runs neither again."""

    #: Why the run in this process was stopped, for the driver to end with once `fit()`
    #: returns (`take_reason`). Kept on the class: Tune restores its stopper and callbacks
    #: from their pickles, so a restored run's FailFast is not one the driver made, but every
    #: one of them lives in the driver's process.
    _stopped_for: ClassVar[str | None] = None

    def __init__(self) -> None:
        self.reason: str | None = None
        self.signalled = False

    @classmethod
    def take_reason(cls) -> str | None:
        """Why a FailFast stopped the run in this process since the last call (None if none
        did); cleared, so the next run starts with none."""
        reason, cls._stopped_for = cls._stopped_for, None
        return reason

    def stop(self, reason: str) -> None:
        if self.reason is not None:
            return
        self.reason = reason
        if FailFast._stopped_for is None:
            FailFast._stopped_for = reason
        if callable(signal.getsignal(signal.SIGUSR1)):  # Tune's, installed once fit() started
            self.signalled = True
            os.kill(os.getpid(), signal.SIGUSR1)

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        return self.reason is not None and not self.signalled

    def __getstate__(self) -> dict[str, Any]:
        # Tune saves its stopper with the experiment: a `resume` after the cause is fixed
        # starts with no reason to stop.
        return {"reason": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]


class TrialsFailed(Exception):
    """The run ended because its trials cannot run; `str()` is the one line."""


def raise_if_trials_cannot_run(experiment: Experiment) -> None:
    """A trial that could not start ended the run (`FailFast`); or every trial failed."""
    results = [experiment.read_trial_json(t, "result.json") or {} for t in experiment.trial_ids()]
    errors = [r for r in results if r.get("state") == State.ERROR]
    unstarted = [r for r in errors if "milestone" not in r]  # failed before an evaluation
    if unstarted:
        raise TrialsFailed(f"trials cannot start: {unstarted[0]['reason']}")
    if results and len(errors) == len(results):
        raise TrialsFailed(f"every trial failed; the first: {errors[0]['reason']}")
