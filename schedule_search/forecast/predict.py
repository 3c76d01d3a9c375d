"""The forecast of a sweep: its curves, a law per optimizer and measure, and the rows the
transfer would train, predicted at longer horizons with a bootstrap interval.

Two laws are fitted per optimizer: one on the raw weights' losses (the last iterate, what a
cosine or linear envelope is scored by) and one on the objective (each evaluation's best EMA
of the bank, what the recipe and constant + EMA are scored by). Same form, own parameters:
the EMA lowers the noise floor, and the fit measures by how much rather than assuming it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from schedule_search.core.config import ConfigError
from schedule_search.core.optimizer import SCHEDULE_FREE_LR
from schedule_search.core.schedules import ScheduleConfig
from schedule_search.forecast.law import Curve, LossLaw, Run, fit_law, with_schedule
from schedule_search.store.experiment import Experiment
from schedule_search.store.records import read_records

__all__ = ["Forecast", "LawFit", "forecast_sweep", "sweep_curves"]

#: A law has 8 parameters: it is fitted on at least twice as many evaluations, of at least
#: 3 runs (a bootstrap over fewer draws the same run most of the time).
MIN_CURVES = 3
MIN_POINTS = 16
#: Bootstrap refits (curves drawn with replacement) behind each interval (10th-90th %).
BOOTSTRAP = 20
#: The envelopes' LR grid: this many log-spaced LRs over the swept range widened 4x each way.
LR_GRID = 61
RAW, OBJECTIVE = "raw", "objective"


@dataclass(frozen=True)
class LawFit:
    """A law fitted on `curves`, with its bootstrap refits."""

    curves: list[Curve]
    law: LossLaw
    resampled: list[LossLaw]


@dataclass(frozen=True)
class Cell:
    loss: float
    low: float
    high: float
    lr: float


@dataclass(frozen=True)
class Forecast:
    horizons: list[float]
    recipe_trial: str
    laws: dict[str, LawFit]
    rows: dict[str, dict[float, Cell]]


def sweep_curves(experiment: Experiment) -> dict[tuple[str, str], list[Curve]]:
    """Every trial's evaluations as curves, keyed by (optimizer name, measure): RAW (the raw
    weights' losses) or OBJECTIVE (the objective the sweep ranks by). Corrupt trials and
    non-finite losses are left out; a trial ASHA stopped contributes what it measured."""
    groups: dict[tuple[str, str], list[Curve]] = {}
    for trial_id in experiment.trial_ids():
        records = read_records(experiment.trial_dir(trial_id))
        if records.problem or "config" not in records.config:
            continue
        run, optimizer = _run_of(records.config["config"])
        for measure in (RAW, OBJECTIVE):
            points = {
                e.chinchilla: e.loss_at(0.0) if measure == RAW else e.val_loss
                for e in records.history
            }
            points = {t: loss for t, loss in points.items() if math.isfinite(loss)}
            if points:
                groups.setdefault((optimizer, measure), []).append(Curve(run, points))
    return groups


def _run_of(config: dict) -> tuple[Run, str]:
    schedule = ScheduleConfig(**config["schedule"])
    microbatches = int(config.get("window", {}).get("microbatches") or 1)
    return Run(config["optimizer"]["lr"], schedule, microbatches), config["optimizer"]["name"]


def fit_group(curves: list[Curve], what: str, seed: int = 0) -> LawFit:
    points = sum(len(c.points) for c in curves)
    if len(curves) < MIN_CURVES or points < MIN_POINTS:
        raise ConfigError(
            f"forecast: {what}: {points} evaluation(s) of {len(curves)} trial(s); the law "
            f"needs {MIN_POINTS} of at least {MIN_CURVES} trials (trials that evaluate more "
            "often, or run longer before a scheduler stops them)"
        )
    law = fit_law(curves)
    rng = np.random.default_rng(seed)
    resampled = []
    for _ in range(BOOTSTRAP):
        drawn = [curves[i] for i in rng.integers(0, len(curves), len(curves))]
        resampled.append(fit_law(drawn, start=law))
    return LawFit(curves, law, resampled)


def _cell(fit: LawFit, predict: Callable[[LossLaw], tuple[float, float]]) -> Cell:
    loss, lr = predict(fit.law)
    spread = [predict(law)[0] for law in fit.resampled]
    low, high = np.percentile(spread, [10, 90])
    return Cell(loss, float(min(low, loss)), float(max(high, loss)), lr)


def _fixed(run: Run, horizon: float) -> Callable[[LossLaw], tuple[float, float]]:
    return lambda law: (float(law.predict(run, [horizon])[0]), run.lr)


def _tuned(
    run: Run, horizon: float, lrs: np.ndarray, **schedule: Any
) -> Callable[[LossLaw], tuple[float, float]]:
    """The best loss at `horizon` over `lrs` of `run` with `schedule` ending there."""
    shaped = with_schedule(run, horizon=horizon, **schedule)

    def best(law: LossLaw) -> tuple[float, float]:
        losses = [
            float(law.predict(Run(lr, shaped.schedule, run.microbatches), [horizon])[0])
            for lr in lrs
        ]
        i = int(np.argmin(losses))
        return losses[i], float(lrs[i])

    return best


def forecast_sweep(
    experiment: Experiment, recipe_trial: str, horizons: Sequence[float]
) -> Forecast:
    """The recipe continued, constant + EMA at its LR, and the cosine (to 10%) and
    linear-to-zero envelopes at each horizon's best LR, as the transfer trains them."""
    config = read_records(experiment.trial_dir(recipe_trial)).config["config"]
    recipe, optimizer = _run_of(config)
    curves = sweep_curves(experiment)
    # The recipe's own optimizer by its objective; AdamW's for constant + EMA (objective) and
    # the envelopes (raw weights).
    needed = sorted({(optimizer, OBJECTIVE), ("adamw", OBJECTIVE), ("adamw", RAW)})
    laws = {
        f"{name}/{measure}": fit_group(
            curves.get((name, measure), []), f"{experiment.root}: {name} ({measure})"
        )
        for name, measure in needed
    }
    swept = [c.run.lr for c in laws[f"adamw/{RAW}"].curves]
    lrs = np.geomspace(min(swept) / 4, max(swept) * 4, LR_GRID)
    # Constant + EMA trains with AdamW at the LR the transfer gives it: a schedule-free
    # recipe's over sqrt(10) (`TransferStudy.adamw_lr`), the recipe's own otherwise.
    adamw_lr = recipe.lr / SCHEDULE_FREE_LR if optimizer == "schedulefree_adamw" else recipe.lr
    constant = with_schedule(replace(recipe, lr=adamw_lr), kind="constant")
    rows: dict[str, dict[float, Cell]] = {}
    for horizon in horizons:
        for label, fit, predict in (
            ("recipe (best EMA)", laws[f"{optimizer}/{OBJECTIVE}"], _fixed(recipe, horizon)),
            ("constant + EMA (best EMA)", laws[f"adamw/{OBJECTIVE}"], _fixed(constant, horizon)),
            (
                "cosine envelope (last iterate)",
                laws[f"adamw/{RAW}"],
                _tuned(recipe, horizon, lrs, kind="cosine", floor=0.1),
            ),
            (
                "linear-to-zero envelope (last iterate)",
                laws[f"adamw/{RAW}"],
                _tuned(recipe, horizon, lrs, kind="linear"),
            ),
        ):
            rows.setdefault(label, {})[horizon] = _cell(fit, predict)
    return Forecast(list(horizons), recipe_trial, laws, rows)
