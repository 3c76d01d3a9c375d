"""The live view of a sweep or transfer: one status line after every trial event.

Tune's own tables are turned off (they repeat every trial's columns every few seconds); this
prints what someone watching a sweep asks: how many trials run, ended and wait; the best
objective so far and the config that reached it; each trial's tokens/s; and an ETA.

The ETA counts work in Chinchilla multiples: what the planned trials still have to train,
divided by the rate this driver has seen. With early stopping the remaining work is an upper
bound, hence "ETA <=". It is shown once a trial has ended or a tenth of the work is done:
before that the rate is mostly Ray's start-up (the first ETA of a 5-minute sweep said 26).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from schedule_search.core.states import State
from schedule_search.store.records import METRIC
from schedule_search.sweep.space import short_name, value_text

__all__ = ["LiveView"]


Span = Callable[[dict[str, Any]], tuple[float, float]]


@dataclass
class _Trial:
    origin: float  # the Chinchilla multiple the trial starts from (a branch's trunk point)
    end: float  # the multiple it trains to
    reached: float  # the multiple it has reached (where this driver saw it resume, at first)
    state: State = State.RUNNING


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


def _short(params: dict[str, Any]) -> str:
    """`optimizer.lr=0.00312` as `lr=0.00312` (`space.short_name`), 3 digits."""
    return ", ".join(f"{short_name(key)}={value_text(value, 3)}" for key, value in params.items())


class LiveView:
    """Counts trials by state and work by Chinchilla multiples; prints after every event.

    `span(params)` gives the (start, end) Chinchilla multiples a trial trains over, so the ETA
    is right for trials of different lengths (a transfer's runs) and for branches."""

    def __init__(self, total: int, planned_units: float, span: Span, wall_clock=time.monotonic):
        self.total = total
        self.planned_units = planned_units
        self.span = span
        self.wall_clock = wall_clock
        self.started_at = wall_clock()
        self.trials: dict[str, _Trial] = {}
        self.units_this_session = 0.0
        self.ended_this_session = 0
        self.best: tuple[float, str, dict[str, Any]] | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A resumed driver gets the view back through the recorder's callback state (Tune
        saves it with each snapshot): the trials seen are kept, the clock and the rate start
        again with the new driver."""
        self.__dict__.update(state)
        self.started_at = self.wall_clock()
        self.units_this_session = 0.0
        self.ended_this_session = 0

    def started(self, trial_id: str, params: dict[str, Any], resumed_from: float) -> None:
        start, end = self.span(params)
        if trial_id in self.trials:  # restarted after a failure, or by a resumed driver
            trial = self.trials[trial_id]
            trial.state = State.RUNNING
            # It goes on from its last checkpoint, which may lie before what was seen of it.
            trial.reached = max(trial.origin, resumed_from)
            self._print(f"trial {trial_id} resumed from {trial.reached:g}x")
            return
        self.trials[trial_id] = _Trial(origin=start, end=end, reached=max(start, resumed_from))
        self._print(f"trial {trial_id} started ({_short(params)})")

    def result(self, trial_id: str, params: dict[str, Any], result: dict[str, Any]) -> None:
        trial = self.trials.get(trial_id)
        if trial is None:
            self.started(trial_id, params, 0.0)
            trial = self.trials[trial_id]
        reached = float(result.get("chinchilla", trial.reached))
        self.units_this_session += max(0.0, reached - trial.reached)
        trial.reached = max(trial.reached, reached)
        loss = result.get(METRIC, math.nan)
        if math.isfinite(loss) and (self.best is None or loss < self.best[0]):
            fraction = result.get("ema_fraction")
            self.best = (
                loss,
                trial_id,
                params if fraction is None else {**params, "ema": fraction},
            )
        self._print(
            f"trial {trial_id}: {reached:g}x  {METRIC} {loss:.4f}  "
            f"{result.get('tokens_per_s', 0):,.0f} tok/s"
        )

    def finished(self, trial_id: str, params: dict[str, Any], state: State, why: str = "") -> None:
        if trial_id not in self.trials:  # ended before this driver saw it start
            start, end = self.span(params)
            self.trials[trial_id] = _Trial(origin=start, end=end, reached=end)
        self.trials[trial_id].state = state
        self.ended_this_session += 1
        self._print(f"trial {trial_id} {state}" + (f": {why}" if why else ""))

    def remaining_units(self) -> float:
        """Work left: the planned total, less what ended trials covered (all of it: a trial
        stopped early will not train the rest), less what running ones have reached."""
        covered = sum(
            (t.reached if t.state == State.RUNNING else t.end) - t.origin
            for t in self.trials.values()
        )
        return max(0.0, self.planned_units - covered)

    def eta_s(self) -> float | None:
        elapsed = self.wall_clock() - self.started_at
        if self.units_this_session <= 0 or elapsed <= 0:
            return None
        if not self.ended_this_session and self.units_this_session < 0.1 * self.planned_units:
            return None  # the rate so far is mostly start-up
        return self.remaining_units() / (self.units_this_session / elapsed)

    def status_line(self) -> str:
        counts = dict.fromkeys(
            (State.RUNNING, State.COMPLETED, State.STOPPED, State.DIVERGED, State.ERROR), 0
        )
        for trial in self.trials.values():
            counts[trial.state] = counts.get(trial.state, 0) + 1
        waiting = max(0, self.total - len(self.trials))
        parts = [f"{n} {state}" for state, n in counts.items() if n or state == State.RUNNING]
        parts.append(f"{waiting} waiting")
        line = f"[{_duration(self.wall_clock() - self.started_at)}] " + ", ".join(parts)
        if self.best is not None:
            loss, trial_id, params = self.best
            line += f" | best {loss:.4f} (trial {trial_id}: {_short(params)})"
        eta = self.eta_s()
        line += f" | ETA <= {_duration(eta)}" if eta is not None else " | ETA after more results"
        return line

    def _print(self, event: str) -> None:
        print(f"  {event}\n{self.status_line()}", flush=True)
