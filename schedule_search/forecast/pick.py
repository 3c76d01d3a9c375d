"""Which trial to export for a longer horizon: each trial that reached the sweep's horizon,
continued along its own curve (`own_curve`), ranked by its forecast there (`export --at`).

The trial best at the sweep's horizon need not be best later: a higher LR starts faster and
levels off higher. On the default sweep the own curve put its 4x pick (schedule-free AdamW at
3.75e-2) 0.013 and 0.019 nats behind a lower-LR schedule-free trial at 16x and 32x; the
transfer then measured both within 0.0045 of their forecasts at 8x-32x. `--at 32` picked an
AdamW trial there, which beat the 4x pick at 32x by 0.0116 ± 0.0102 nats over 3 seeds, though
its own curve forecast it 0.018 too low: on AdamW runs the curve ranks better than it predicts
(BENCHMARKS.md, "The own curve checked on the new recipe"). Only trials with `MIN_OWN_POINTS`
evaluations past their warmup have a curve to continue; the rest are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from schedule_search.core.config import ConfigError
from schedule_search.core.schedules import HORIZON_AWARE
from schedule_search.forecast.own_curve import MIN_OWN_POINTS, continue_curve, past_warmup
from schedule_search.store.experiment import Experiment, TrialRow

__all__ = ["TrialForecast", "forecast_trials"]


@dataclass(frozen=True)
class TrialForecast:
    """A trial's own-curve forecast at `horizon`, with the leave-one-out range."""

    trial_id: str
    horizon: float
    loss: float
    low: float
    high: float
    fitted_on: tuple[float, ...]


def forecast_trials(
    experiment: Experiment, finished: list[TrialRow], horizon: float, at: float
) -> list[TrialForecast]:
    """Every horizon-free trial of `finished` (those that reached `horizon`, the sweep's)
    with a curve, continued to `at`, best first; a one-line ConfigError where none has one."""
    forecasts = []
    for row in finished:
        schedule = experiment.read_trial_json(row.trial_id, "config.json")["config"]["schedule"]
        if schedule["kind"] in HORIZON_AWARE:  # it ends at the horizon: nothing to continue
            continue
        objective = {chinchilla: loss for _, chinchilla, loss in row.curve}
        points = past_warmup(objective, float(schedule["warmup"]))
        if len(points) >= MIN_OWN_POINTS:
            loss, low, high = continue_curve(points, at)
            forecasts.append(TrialForecast(row.trial_id, at, loss, low, high, tuple(points)))
    if not forecasts:
        raise ConfigError(
            f"{experiment.root}: no horizon-free trial that reached {horizon:g}x has "
            f"{MIN_OWN_POINTS} evaluations past its warmup to continue (budget.eval_at); "
            "export without --at picks by the loss at the horizon"
        )
    return sorted(forecasts, key=lambda f: (f.loss, f.trial_id))
