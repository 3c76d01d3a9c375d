"""Search spaces: YAML files that fix part of a training config and search the rest.

    name: default
    samples: 8                    # trials
    seed: 0                       # TPE seed
    startup_trials: 4             # random trials (points_to_evaluate included) before TPE
    sampler: tpe                  # tpe | gp | random (bench/search.py measured them)
    scheduler: auto               # auto | asha | fifo (auto: ASHA for horizon-free schedules)
    objectives: [val_loss]        # or [val_loss, wall_s]: loss and wall-clock seconds to the
                                  # horizon, a multi-objective search (export picks from the
                                  # Pareto front: `export --max-slowdown`)
    base: {...}                   # a training config (see TrainConfig); what is not searched
    params:                       # dotted TrainConfig keys -> distributions
      optimizer.lr: {type: loguniform, low: 1.0e-3, high: 3.0e-2}
      schedule.gamma: {type: uniform, low: 0.0, high: 1.0}
      window.microbatches: {type: int, low: 1, high: 8}
      schedule.kind: {type: choice, values: [constant, poly]}
    points_to_evaluate:           # trials to run first, each giving every searched param
      - {optimizer.lr: 3.0e-3, schedule.gamma: 0.5, window.microbatches: 1, schedule.kind: poly}

A space is validated completely before anything starts: besides its own keys and types, the
training config is built at both ends of every range and with every choice, so a range that
leaves a key's valid values is reported with the file and the key; every point to evaluate
gives every searched param a value inside its range; the budget (what every trial is compared
at) and checkpointing (which changes no result) are not searched. Searching `ema.objective`
adds the sampled fraction to the EMA bank.
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from schedule_search.core.averaging import DEFAULT_FRACTIONS
from schedule_search.core.config import (
    PLAIN_NAME,
    STRICT,
    ConfigError,
    is_plain_name,
    load_yaml,
    parse,
)
from schedule_search.core.schedules import HORIZON_AWARE
from schedule_search.tasks.registry import build_task
from schedule_search.train.config import TrainConfig

__all__ = [
    "STARTUP_TRIALS",
    "UNSEARCHABLE",
    "Param",
    "SearchSpace",
    "load_space",
    "set_dotted",
    "shardings",
    "trial_config",
    "uses_asha",
    "value_text",
]

STARTUP_TRIALS = 4  # bench/search.py measures this against Optuna's default of 10


@dataclass
class Param:
    """One searched key. `low`/`high` for uniform, loguniform and int; `values` for choice."""

    __pydantic_config__ = STRICT

    type: Literal["uniform", "loguniform", "int", "choice"]
    low: float | None = None
    high: float | None = None
    log: bool = False
    values: list[Any] | None = None

    def __post_init__(self) -> None:
        if self.type == "choice":
            if not self.values:
                raise ValueError("values: a choice needs a non-empty list of values")
            if self.low is not None or self.high is not None:
                raise ValueError("low: a choice takes values, not low/high")
            return
        if self.values is not None:
            raise ValueError(f"values: only a choice takes values, not {self.type}")
        if self.low is None or self.high is None:
            raise ValueError(f"low: {self.type} needs both low and high")
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ValueError(f"low: bounds must be finite numbers, got {self.low}..{self.high}")
        if not self.low < self.high:
            raise ValueError(f"high: must exceed low ({self.low}), got {self.high}")
        if (self.type == "loguniform" or self.log) and self.low <= 0:
            raise ValueError(f"low: a log scale needs low > 0, got {self.low}")
        if self.type == "int" and (self.low != int(self.low) or self.high != int(self.high)):
            raise ValueError(f"low: int bounds must be whole numbers, got {self.low}..{self.high}")

    def contains(self, value: Any) -> bool:
        """Whether `value` is one this param can take (a point to evaluate must be)."""
        if self.type == "choice":
            return value in (self.values or [])
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.type == "int" and value != int(value):
            return False
        return self.low <= value <= self.high  # type: ignore[operator]

    def describe(self) -> str:
        if self.type == "choice":
            return f"one of {self.values}"
        kind = "a whole number" if self.type == "int" else "a number"
        return f"{kind} in [{self.low:g}, {self.high:g}]"

    def corners(self) -> list[Any]:
        """The values that must all make a valid training config."""
        if self.type == "choice":
            return list(self.values or [])
        if self.type == "int":
            return [int(self.low), int(self.high)]  # type: ignore[arg-type]
        return [self.low, self.high]


@dataclass
class SearchSpace:
    __pydantic_config__ = STRICT

    name: str = "sweep"
    samples: Annotated[int, Field(gt=0)] = 8
    seed: Annotated[int, Field(ge=0)] = 0
    startup_trials: Annotated[int, Field(ge=1)] = STARTUP_TRIALS
    sampler: Literal["tpe", "gp", "random"] = "tpe"
    scheduler: Literal["auto", "asha", "fifo"] = "auto"
    base: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Param] = field(default_factory=dict)
    points_to_evaluate: list[dict[str, Any]] = field(default_factory=list)
    objectives: list[Literal["val_loss", "wall_s"]] = field(default_factory=lambda: ["val_loss"])

    def __post_init__(self) -> None:
        if not is_plain_name(self.name):
            raise ValueError(f"name: expected {PLAIN_NAME}, got {self.name!r}")
        if not self.objectives or self.objectives[0] != "val_loss":
            raise ValueError(f"objectives: must start with val_loss, got {self.objectives}")
        if len(set(self.objectives)) != len(self.objectives):
            raise ValueError(f"objectives: duplicates in {self.objectives}")


def value_text(value: Any, digits: int = 4) -> str:
    """A sampled value as tables and the live view show it: floats to `digits` significant
    digits, anything else as it is."""
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: {part} is not a section")
        node = child
    node[parts[-1]] = value


def trial_config(space: SearchSpace, values: dict[str, Any], source: str = "space") -> TrainConfig:
    """The training config of one trial: the space's base with the sampled values set."""
    tree = copy.deepcopy(space.base)
    for key, value in values.items():
        set_dotted(tree, key, value)
    ema = tree.setdefault("ema", {})
    if isinstance(ema, dict) and isinstance(ema.get("objective"), (int, float)):
        # A searched (or fixed) fraction joins the bank, so its loss is evaluated.
        fractions = ema.get("fractions", list(DEFAULT_FRACTIONS))
        if isinstance(fractions, list) and ema["objective"] not in fractions:
            ema["fractions"] = sorted([*fractions, ema["objective"]])
    return parse(TrainConfig, tree, source)


def load_space(path: str | Path, check_task: bool = True) -> SearchSpace:
    """Read and validate a space completely; every problem is a ConfigError naming file:key.
    `check_task=False` reads an experiment's own copy without building its task: `status`,
    `export` and `report` work from the records alone, where the task's module or data is
    not (a finished sweep read on another machine, or after its data moved)."""
    source = str(path)
    space = parse(SearchSpace, load_yaml(path), source)
    base = trial_config(space, {}, source)
    if check_task:  # the task's own options and data, checked once
        build_task(base.task, base.seed, source)
    if not space.params:
        raise ConfigError(f"{source}: params: nothing to search; give at least one key")
    for key, param in space.params.items():
        _check_searchable(source, key)
        for value in param.corners():
            try:
                config = trial_config(space, {key: value}, source)
                if check_task and key.startswith("task."):
                    build_task(config.task, config.seed, source)
            except ConfigError as err:
                raise ConfigError(f"{err} (from params.{key} = {value!r})") from None
    _check_pairs(space, source)
    for i, point in enumerate(space.points_to_evaluate):
        _check_point(space, point, f"{source}: points_to_evaluate[{i}]")
    kinds = {base.schedule.kind}
    if "schedule.kind" in space.params:
        kinds |= set(space.params["schedule.kind"].corners())
    if space.scheduler == "asha" and kinds & set(HORIZON_AWARE):
        raise ConfigError(
            f"{source}: scheduler: asha stops trials early, which is only valid for horizon-free "
            "schedules (constant, poly); use fifo for cosine, linear or wsd"
        )
    return space


def _check_pairs(space: SearchSpace, source: str) -> None:
    """Every pair of searched keys at their corners makes a valid config, so that no sampled
    combination (`sharding: fsdp` with `window.policy: grad_norm`, say) fails mid-sweep."""
    for (key, param), (other, other_param) in itertools.combinations(space.params.items(), 2):
        for value, other_value in itertools.product(param.corners(), other_param.corners()):
            try:
                trial_config(space, {key: value, other: other_value}, source)
            except ConfigError as err:
                raise ConfigError(
                    f"{err} (from params.{key} = {value!r} with params.{other} = {other_value!r})"
                ) from None


#: Sections a search may not vary, and why.
UNSEARCHABLE = {
    "budget": "every trial is compared at the same budget (set base.budget, or sweep --horizon)",
    "checkpoint": "checkpointing changes no result",
}


def _check_searchable(source: str, key: str) -> None:
    section = key.split(".")[0]
    if key.startswith("base.") or section not in TrainConfig.__dataclass_fields__:
        raise ConfigError(f"{source}: params.{key}: not a training config key")
    if section in UNSEARCHABLE:
        raise ConfigError(f"{source}: params.{key}: not searchable; {UNSEARCHABLE[section]}")


def _check_point(space: SearchSpace, point: dict[str, Any], where: str) -> None:
    """A point to evaluate is a whole trial: every searched param, each within its range."""
    unknown = sorted(set(point) - set(space.params))
    if unknown:
        raise ConfigError(f"{where}: {unknown[0]} is not a searched param")
    missing = [key for key in space.params if key not in point]
    if missing:
        raise ConfigError(f"{where}: {missing[0]} is missing; a point gives every searched param")
    for key, value in point.items():
        param = space.params[key]
        if not param.contains(value):
            raise ConfigError(f"{where}.{key}: expected {param.describe()}, got {value!r}")
    trial_config(space, point, where)


def shardings(space: SearchSpace) -> set[str]:
    """The `sharding` values a space's trials may take (fixed in base, or searched)."""
    found: set[str] = {trial_config(space, {}).sharding}
    if "sharding" in space.params:
        found |= {str(value) for value in space.params["sharding"].corners()}
    return found


def uses_asha(space: SearchSpace) -> bool:
    if space.scheduler != "auto":
        return space.scheduler == "asha"
    base = trial_config(space, {})
    kinds = {base.schedule.kind}
    if "schedule.kind" in space.params:
        kinds |= set(space.params["schedule.kind"].corners())
    return kinds <= {"constant", "poly"}
