"""`export`: the best trial of a finished sweep as a recipe file, read from the experiment
folder alone (no Ray, no task code)."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from schedule_search.core.config import ConfigError, parse
from schedule_search.recipe import RECIPE_FORMAT, RecipeSpec, load_recipe, write_recipe
from schedule_search.store.experiment import Experiment, TrialRow, select_best
from schedule_search.store.facts import SweepFacts, read_facts
from schedule_search.store.records import read_records
from schedule_search.train.config import TrainConfig

__all__ = ["export_best", "exported_trial"]


def exported_trial(experiment: Experiment) -> tuple[str, float]:
    """The trial the sweep exported as its recipe (`recipe.yaml`), or the one `export` would
    pick, and the EMA fraction the recipe evaluates with."""
    exported = experiment.root / "recipe.yaml"
    if exported.is_file():
        spec = load_recipe(exported).spec
        trial_id = spec.source.get("trial_id")
        if trial_id not in experiment.trial_ids():  # written by hand, or for another sweep
            raise ConfigError(
                f"{exported}: source.trial_id: expected a trial of {experiment.root} "
                f"(one of {', '.join(experiment.trial_ids()) or 'none'}), got {trial_id!r}; "
                "`schedule-search export` writes it again"
            )
        return trial_id, float(spec.ema.objective)
    horizon = read_facts(experiment.root).horizon
    best = experiment.best(horizon)
    if best is None:
        raise ConfigError(f"{experiment.root}: no trial has reached the {horizon:g}x horizon yet")
    return best.trial_id, float(best.ema_fraction)


def _choose(
    experiment: Experiment,
    facts: SweepFacts,
    max_slowdown: float | None,
    at: float | None,
    within: float | None = None,
) -> tuple[TrialRow, str, dict[str, Any]]:
    """The trial to export, the rule that chose it, and with `at` its forecast there."""
    if within is not None and at is None:
        raise ConfigError("--within: narrows the trials --at ranks by forecast; add --at H")
    if at is not None:
        if max_slowdown is not None:
            raise ConfigError("--at: picks by the forecast loss alone; drop --max-slowdown")
        facts.check_beyond([at], "--at")
    damaged = experiment.problems()
    if damaged:  # the best may be the damaged trial: picking among the rest is a guess
        raise ConfigError(
            f"{damaged[0]}; export needs every trial's records (move that trial's folder "
            "out of trials/ to export without it)"
        )
    finished = experiment.finished(facts.horizon)  # every trial's records, read once
    best = select_best(finished, max_slowdown)
    if best is None:
        raise ConfigError(
            f"{experiment.root}: no trial has reached the {facts.horizon:g}x horizon yet"
        )
    if at is None:
        slower = f" within {max_slowdown:g}x the fastest trial's time" if max_slowdown else ""
        return best, "lowest val_loss" + slower, {}
    from schedule_search.forecast.pick import forecast_trials

    near = [r for r in finished if within is None or r.val_loss <= best.val_loss + within]
    try:
        chosen = forecast_trials(experiment, near, facts.horizon, at)[0]
    except ConfigError:
        if within is None:
            raise
        raise ConfigError(
            f"--within {within:g}: no horizon-free trial with a curve to continue is within "
            f"{within:g} nats of the best at {facts.horizon:g}x (trial {best.trial_id}, "
            f"{best.val_loss:.4f}); widen --within"
        ) from None
    forecast = {**asdict(chosen), "best_at_sweep_horizon": best.trial_id}
    if within is not None:
        forecast["within"] = within
    best = next(r for r in finished if r.trial_id == chosen.trial_id)
    rule = f"lowest forecast val_loss at {at:g}x, the trial's own curve continued"
    if within is not None:
        rule += f", among trials within {within:g} nats of the best at {facts.horizon:g}x"
    return best, rule, {"forecast": forecast}


def export_best(
    experiment: Experiment,
    output: Path,
    facts: SweepFacts,
    max_slowdown: float | None = None,
    at: float | None = None,
    within: float | None = None,
) -> tuple[TrialRow, RecipeSpec]:
    """Write the best trial's config as a recipe file (atomically): the lowest loss at the
    sweep's horizon, or with `at`, the lowest own-curve forecast at that longer horizon
    (`forecast.pick`), the forecast written into the recipe's objective."""
    horizon = facts.horizon
    best, rule, forecast = _choose(experiment, facts, max_slowdown, at, within)
    config = parse(
        TrainConfig, experiment.read_trial_json(best.trial_id, "config.json")["config"], "trial"
    )
    last = read_records(experiment.trial_dir(best.trial_id)).history[-1]
    # The recipe evaluates with the fraction that won at the horizon and keeps the bank.
    ema = replace(config.ema, objective=float(best.ema_fraction))
    spec = RecipeSpec(
        format=RECIPE_FORMAT,
        optimizer=config.optimizer,
        schedule=config.schedule,
        ema=ema,
        window=config.window,
        sharding=config.sharding,
        family=best.family,
        # The trial's own model (a space may search task.* keys), as it recorded it.
        n_params=int(last.n_params),
        tokens_per_param=config.budget.tokens_per_param,
        tokens_per_reference_step=float(last.tokens_per_reference_step),
        objective={
            "metric": "val_loss",
            "value": best.val_loss,
            "horizon": horizon,
            "wall_s": best.wall_s,
            "ema_fraction": float(best.ema_fraction),
            "rule": rule,
            **forecast,
        },
        source={
            "experiment": experiment.root.name,
            "path": str(experiment.root),
            "trial_id": best.trial_id,
            "task": config.task,
            "params": best.params,
        },
    )
    write_recipe(output, spec)
    return best, spec
