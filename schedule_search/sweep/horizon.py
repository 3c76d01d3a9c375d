"""A new sweep's horizon: `--horizon` moves the budget and the end of every horizon-aware
schedule together, and a space whose cosine, linear or WSD trials would be scored away from
their own end is refused before anything launches.

Checked for a new sweep only: a resumed sweep's stored space ran already, and `status`,
`export` and `report` read what exists.
"""

from __future__ import annotations

import math
from typing import Any

from schedule_search.core.config import ConfigError
from schedule_search.core.schedules import HORIZON_AWARE
from schedule_search.store.experiment import FAMILY
from schedule_search.sweep.space import (
    SearchSpace,
    config_key,
    each_family,
    located,
    searched,
    trial_config,
)
from schedule_search.train.config import TrainConfig

__all__ = ["check_own_horizons", "set_horizon"]


def set_horizon(data: dict[str, Any], horizon: float) -> None:
    """`--horizon` on a space's raw YAML `data`: the budget's horizon, and the end T of every
    schedule (the base's, each family's) that is horizon-aware or names an end for a searched
    kind that may be."""
    base = data.setdefault("base", {})
    if not isinstance(base, dict):
        return  # the space's own check names it
    budget = base.setdefault("budget", {})
    if isinstance(budget, dict):
        budget["horizon"] = horizon
    trees: list[Any] = [base]
    families = data.get("families")
    if isinstance(families, dict):
        trees += [family.get("base") for family in families.values() if isinstance(family, dict)]
    for tree in trees:
        schedule = tree.get("schedule") if isinstance(tree, dict) else None
        if isinstance(schedule, dict) and (
            schedule.get("kind") in HORIZON_AWARE or "horizon" in schedule
        ):
            schedule["horizon"] = horizon


def check_own_horizons(space: SearchSpace, source: str) -> None:
    """Each family's base config, and the corners of every searched schedule key, end a
    horizon-aware schedule at the budget's horizon."""
    for family in each_family(space):
        fixed = {FAMILY: family} if family else {}
        where = f" (in family {family})" if family else ""
        _check(trial_config(space, fixed, source), source, where)
        for key, param in searched(space, family).items():
            if config_key(key).startswith("schedule."):
                for value in param.corners():
                    config = trial_config(space, {**fixed, key: value}, source)
                    _check(config, source, f" (from {located(key)} = {value!r})")


def _check(config: TrainConfig, source: str, where: str) -> None:
    """A cosine, linear or WSD trial is scored where its own schedule ends: trained past its T
    it sits at its floor, stopped before it it never finished decaying; either way it is not
    the schedule tuned for that horizon."""
    schedule, horizon = config.schedule, config.budget.horizon
    if schedule.kind not in HORIZON_AWARE:
        return
    assert schedule.horizon is not None  # ScheduleConfig requires it of these kinds
    if not math.isclose(schedule.horizon, horizon):
        raise ConfigError(
            f"{source}: schedule.horizon: {schedule.horizon:g} is not budget.horizon "
            f"{horizon:g}; a {schedule.kind} trial is scored at the end of its own schedule "
            f"(set both, or pass --horizon, which sets both){where}"
        )
