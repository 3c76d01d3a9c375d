"""The states a run or a sweep trial can be in, as every record writes them."""

from __future__ import annotations

from enum import Enum

__all__ = ["ENDINGS", "KEPT", "State"]


class State(str, Enum):
    """A run's or trial's state. A `str` so records and Tune metrics keep the plain words.

    A training run is `running`, then `completed` or `diverged`; a trial of a sweep can also
    be `stopped` (early, by ASHA), end in `error`, or be `pending` (created, not yet
    started); `corrupt` marks one whose records were damaged."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    STOPPED = "stopped"
    DIVERGED = "diverged"
    ERROR = "error"
    #: Shown for a trial whose records were damaged from outside; never ranked.
    CORRUPT = "corrupt"

    def __str__(self) -> str:
        return self.value


#: The states a trial ends in: its record no longer changes.
ENDINGS = (State.COMPLETED, State.STOPPED, State.DIVERGED, State.ERROR)

#: The endings whose record is the trial's result. An `error` is not one: a resume runs the
#: trial again (Tune restores errored trials under their ids).
KEPT = (State.COMPLETED, State.STOPPED, State.DIVERGED)
