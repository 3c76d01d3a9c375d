"""The forecast of a sweep: its curves, a law per optimizer and measure, and the rows the
transfer would train, predicted at longer horizons with an interval.

The recipe is forecast by its own curve continued (`forecast.own_curve`) where its trial
evaluated often enough past its warmup, by its optimizer's law otherwise; the rows no trial
trained (constant + EMA at the transfer's LR, the envelopes) by AdamW's laws.

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
from schedule_search.forecast.own_curve import MIN_OWN_POINTS, continue_curve, past_warmup
from schedule_search.store.experiment import Experiment
from schedule_search.store.facts import read_facts
from schedule_search.store.records import read_records

__all__ = [
    "ENVELOPES",
    "INTERVALS",
    "METHODS",
    "RECIPE",
    "Forecast",
    "LawFit",
    "envelope_cells",
    "fit_group",
    "forecast_sweep",
    "law_cells",
    "picked_cells",
    "sweep_curves",
]

#: A law has 8 parameters: it is fitted on at least twice as many evaluations, of at least
#: 3 runs (a bootstrap over fewer draws the same run most of the time).
MIN_CURVES = 3
MIN_POINTS = 16
#: Bootstrap refits (curves drawn with replacement) behind each interval (10th-90th %).
BOOTSTRAP = 20
#: The envelopes' LR grid: this many log-spaced LRs over the swept range widened 4x each way.
LR_GRID = 61
RAW, OBJECTIVE = "raw", "objective"
#: What a cell's forecast and interval come from.
LAW, OWN_CURVE = "law", "own curve"
#: The recipe's row.
RECIPE = "recipe (best EMA)"
#: The rows a forecast can be asked for (`forecast --methods`), by the transfer's names.
METHODS = ("recipe", "constant", "cosine", "linear")
#: Each basis's interval, as `forecast.json` states it.
INTERVALS = {
    LAW: "10th-90th percentile of the law refitted on trials drawn with replacement",
    OWN_CURVE: "lowest and highest forecast of the curve refitted without each evaluation",
}


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
    basis: str = LAW
    #: Why to read the cell with care ("" if nothing): an envelope whose best LR lies outside
    #: the LRs the law was fitted on is the law extrapolated in LR as well as in time.
    caution: str = ""


@dataclass(frozen=True)
class Forecast:
    horizons: list[float]
    recipe_trial: str
    laws: dict[str, LawFit]
    rows: dict[str, dict[float, Cell]]

    def bases(self) -> dict[str, list[str]]:
        """Each basis the cells are forecast on (`LAW`, `OWN_CURVE`) -> the rows using it."""
        rows: dict[str, list[str]] = {}
        for label, cells in self.rows.items():
            for basis in sorted({cell.basis for cell in cells.values()}):
                rows.setdefault(basis, []).append(label)
        return dict(sorted(rows.items()))


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


def _own_curve_cells(
    experiment: Experiment, recipe_trial: str, recipe: Run, horizons: Sequence[float]
) -> dict[float, Cell] | None:
    """The recipe continued along its own objective curve, or None where its trial made
    fewer than `MIN_OWN_POINTS` evaluations past its warmup (the law forecasts it then)."""
    history = read_records(experiment.trial_dir(recipe_trial)).history
    points = past_warmup({e.chinchilla: e.val_loss for e in history}, recipe.schedule.warmup)
    if len(points) < MIN_OWN_POINTS:
        return None
    return {h: Cell(*continue_curve(points, h), recipe.lr, OWN_CURVE) for h in horizons}


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


def law_cells(fit: LawFit, run: Run, horizons: Sequence[float]) -> dict[float, Cell]:
    """`run` (a horizon-free schedule) at each horizon, by the law `fit`."""
    return {h: _cell(fit, _fixed(run, h)) for h in horizons}


def picked_cells(
    fit: LawFit, run: Run, pick_at: float, lrs: Sequence[float], horizons: Sequence[float]
) -> dict[float, Cell]:
    """`run` (a horizon-free schedule) at each horizon, at the one of `lrs` the law `fit`
    says is best at `pick_at`, as a transfer picks constant + EMA's LR at the sweep's horizon
    and continues it; each bootstrap refit picks again."""

    def picked(horizon: float) -> Callable[[LossLaw], tuple[float, float]]:
        def predict(law: LossLaw) -> tuple[float, float]:
            at_pick = [float(law.predict(replace(run, lr=lr), [pick_at])[0]) for lr in lrs]
            lr = float(lrs[int(np.argmin(at_pick))])
            return float(law.predict(replace(run, lr=lr), [horizon])[0]), lr

        return predict

    return {h: _cautioned(fit, _cell(fit, picked(h))) for h in horizons}


def _fitted_lrs(fit: LawFit) -> tuple[float, float]:
    return min(c.run.lr for c in fit.curves), max(c.run.lr for c in fit.curves)


def _cautioned(fit: LawFit, found: Cell) -> Cell:
    """`found`, with a caution where the LR the law picked lies outside those it was fitted
    on (the law extrapolates in LR there)."""
    low, high = _fitted_lrs(fit)
    if low <= found.lr <= high:
        return found
    caution = f"best LR {found.lr:.2g} outside the fitted LRs {low:.2g}-{high:.2g}"
    return replace(found, caution=caution)


#: The envelopes the transfer trains: each horizon's runs end with this schedule.
ENVELOPES: dict[str, dict[str, Any]] = {
    "cosine envelope (last iterate)": {"kind": "cosine", "floor": 0.1},
    "linear-to-zero envelope (last iterate)": {"kind": "linear"},
}


def envelope_cells(
    fit: LawFit, run: Run, horizons: Sequence[float], kinds: Sequence[str] = ("cosine", "linear")
) -> dict[str, dict[float, Cell]]:
    """Each envelope of `kinds` at each horizon, by the raw weights' law `fit`: `run`'s warmup
    and micro-batches with the envelope's schedule ending at the horizon, at the best of
    `LR_GRID` LRs spanning the fitted curves' LRs widened 4x each way."""
    low, high = _fitted_lrs(fit)
    lrs = np.geomspace(low / 4, high * 4, LR_GRID)

    def cell(horizon: float, schedule: dict[str, Any]) -> Cell:
        return _cautioned(fit, _cell(fit, _tuned(run, horizon, lrs, **schedule)))

    return {
        label: {h: cell(h, schedule) for h in horizons}
        for label, schedule in ENVELOPES.items()
        if schedule["kind"] in kinds
    }


def forecast_sweep(
    experiment: Experiment,
    recipe_trial: str,
    horizons: Sequence[float],
    methods: Sequence[str] = METHODS,
    constant_factors: Sequence[float] | None = None,
) -> Forecast:
    """The rows of `methods` (`METHODS`): the recipe continued, constant + EMA, and the cosine
    (to 10%) and linear-to-zero envelopes at each horizon's best LR, as the transfer trains
    them. Constant + EMA is at the recipe's AdamW LR, or, given the `constant_factors` of it
    the transfer's grid can run, at the one the law finds best at the sweep's horizon.
    Only the laws those rows need are fitted."""
    config = read_records(experiment.trial_dir(recipe_trial)).config["config"]
    recipe, optimizer = _run_of(config)
    curves = sweep_curves(experiment)
    own = _own_curve_cells(experiment, recipe_trial, recipe, horizons)
    envelopes = [kind for kind in ("cosine", "linear") if kind in methods]
    # AdamW's laws for constant + EMA (objective) and the envelopes (raw weights); the
    # recipe's own optimizer's by its objective where its own curve is too short.
    needed = {("adamw", OBJECTIVE)} if "constant" in methods else set()
    if envelopes:
        needed.add(("adamw", RAW))
    if "recipe" in methods and own is None:
        needed.add((optimizer, OBJECTIVE))
    laws = {}
    for name, measure in sorted(needed):
        what = f"{experiment.root}: {name} ({measure})"
        try:
            laws[f"{name}/{measure}"] = fit_group(curves.get((name, measure), []), what)
        except ConfigError as error:
            if own is None:
                raise
            raise ConfigError(
                f"{error}; `--methods recipe` forecasts the recipe alone, by its own curve"
            ) from None
    rows: dict[str, dict[float, Cell]] = {}
    if "recipe" in methods:
        rows[RECIPE] = own or law_cells(laws[f"{optimizer}/{OBJECTIVE}"], recipe, horizons)
    if "constant" in methods:
        # Constant + EMA trains with AdamW around the recipe's AdamW LR: a schedule-free
        # recipe's over sqrt(10) (`TransferStudy.adamw_lr`), the recipe's own otherwise.
        schedule_free = optimizer == "schedulefree_adamw"
        adamw_lr = recipe.lr / SCHEDULE_FREE_LR if schedule_free else recipe.lr
        constant = with_schedule(replace(recipe, lr=adamw_lr), kind="constant")
        fit = laws[f"adamw/{OBJECTIVE}"]
        if constant_factors is not None:
            lattice = [adamw_lr * factor for factor in constant_factors]
            sweep_horizon = read_facts(experiment.root).horizon
            cells = picked_cells(fit, constant, sweep_horizon, lattice, horizons)
        else:
            cells = law_cells(fit, constant, horizons)
        rows["constant + EMA (best EMA)"] = cells
    if envelopes:
        rows.update(envelope_cells(laws[f"adamw/{RAW}"], recipe, horizons, envelopes))
    return Forecast(list(horizons), recipe_trial, laws, rows)
