"""What picks and stops a sweep's trials: Ray's OptunaSearch, told what the Optuna journal
records, and ASHA on the Chinchilla multiple a trial has reached."""

from __future__ import annotations

import math
from functools import partial

from optuna.trial import TrialState
from ray import __version__ as ray_version
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
from ray.tune.search.optuna import OptunaSearch

from schedule_search.core.states import State
from schedule_search.store.records import METRIC
from schedule_search.sweep.optuna_study import (
    make_sampler,
    optuna_distributions,
    suggest_family_trial,
    trial_state,
)
from schedule_search.sweep.space import SearchSpace, uses_asha

__all__ = ["RAY_INTERNALS", "MilestoneOptunaSearch", "scheduler", "searcher"]

#: The private attributes of Ray's OptunaSearch that `MilestoneOptunaSearch` reads and writes:
#: Ray offers no public way to report an intermediate value at a chosen step or to tell a trial
#: a state of ours. They are checked when the searcher is built, so a Ray release that renames
#: them fails at launch in one line, not mid-sweep (tests/unit/sweep/test_searcher.py).
RAY_INTERNALS = ("_ot_trials", "_completed_trials", "_ot_study")


class MilestoneOptunaSearch(OptunaSearch):
    """Ray's OptunaSearch, told what the journal records (`optuna_study.trial_state`).

    Ray's own reports every result as an intermediate value at Tune's `training_iteration`,
    which restarts at 1 when a restored trial runs again, and tells a trial the scheduler
    stopped as COMPLETE with its loss at the rung where it stopped, ranked among losses at the
    horizon. Here an intermediate value's step is the evaluation's milestone index (it keeps
    rising across resumes), and a stopped trial is PRUNED."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        missing = [name for name in RAY_INTERNALS if not hasattr(self, name)]
        if missing:
            raise RuntimeError(
                f"ray {ray_version}: OptunaSearch no longer has {', '.join(missing)}; this "
                "version of schedule-search needs the ray its package requires"
            )
        #: Per trial, the milestones whose values Optuna was told (a resumed trial reports
        #: its last milestone again).
        self._steps_reported: dict[str, set[int]] = {}

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if isinstance(self.metric, list) or trial_id in self._completed_trials:
            return  # Optuna keeps no intermediate values for multi-objective studies
        trial = self._ot_trials.get(trial_id)
        if trial is None or "milestone" not in result:
            return
        reported = self._steps_reported.setdefault(trial_id, set())
        step = int(result["milestone"])
        if step not in reported:  # a resumed trial reports its last milestone again
            trial.report(float(result[self.metric]), step)
            reported.add(step)

    def on_trial_complete(
        self, trial_id: str, result: dict | None = None, error: bool = False
    ) -> None:
        if error or not result or trial_id in self._completed_trials:
            super().on_trial_complete(trial_id, result, error)
            return
        # A scheduler's STOP hands the last result only here, not to `on_trial_result`.
        self.on_trial_result(trial_id, result)
        status = result.get("status")
        row_state = State(status) if status in (State.COMPLETED, State.DIVERGED) else State.STOPPED
        metrics = self.metric if isinstance(self.metric, list) else [self.metric]
        values = [float(result.get(m, math.nan)) for m in metrics]
        state = trial_state(row_state, values)
        told = values if len(values) > 1 else values[0]
        assert self._ot_study is not None  # set up before any trial starts
        self._ot_study.tell(
            self._ot_trials[trial_id], told if state == TrialState.COMPLETE else None, state=state
        )
        self._completed_trials.add(trial_id)


def searcher(space: SearchSpace) -> OptunaSearch:
    """Ray's OptunaSearch over the space: its distributions, or for a space with families a
    define-by-run function (Ray pickles it with the searcher: a module-level function bound
    to the space)."""
    multi = len(space.objectives) > 1
    return MilestoneOptunaSearch(
        space=partial(suggest_family_trial, space)
        if space.families
        else optuna_distributions(space),
        metric=list(space.objectives) if multi else METRIC,
        mode=["min"] * len(space.objectives) if multi else "min",
        points_to_evaluate=space.points_to_evaluate or None,
        sampler=make_sampler(space.sampler, space.seed, space.startup_trials),
    )


def scheduler(space: SearchSpace, horizon: float, milestones: list[float]):
    if not uses_asha(space):
        return FIFOScheduler()
    grace = space.first_rung or (1.0 if 1.0 in milestones else milestones[0])
    # ASHA's rungs are compared with `time_attr`, here Chinchilla multiples (floats), although
    # its signature says int.
    return ASHAScheduler(
        time_attr="chinchilla",
        metric=METRIC,
        mode="min",
        max_t=horizon,  # type: ignore[arg-type]
        grace_period=grace,  # type: ignore[arg-type]
        reduction_factor=2,
    )
