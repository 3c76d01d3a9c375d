"""Search spaces: YAML files that fix part of a training config and search the rest.

    name: default
    samples: 8                    # trials
    seed: 0                       # TPE seed
    startup_trials: 4             # random trials (points_to_evaluate included) before TPE
    sampler: tpe                  # tpe | gp | random (bench/search.py measured them)
    scheduler: auto               # auto | asha | fifo (auto: ASHA for horizon-free schedules)
    first_rung: 0.5               # ASHA's first rung, a milestone (default: 1x if one, else the
                                  # first milestone)
    objectives: [val_loss]        # or [val_loss, wall_s]: loss and wall-clock seconds to the
                                  # horizon, a multi-objective search (export picks from the
                                  # Pareto front: `export --max-slowdown`)
    base: {...}                   # a training config (see TrainConfig); what is not searched
    params:                       # dotted TrainConfig keys -> distributions
      optimizer.lr: {type: loguniform, low: 1.0e-3, high: 3.0e-2}
      schedule.gamma: {type: uniform, low: 0.0, high: 1.0}
      window.microbatches: {type: int, low: 1, high: 8}
      schedule.kind: {type: choice, values: [constant, poly]}
    families:                     # optional: `family` searched as a choice; a family's params
      anytime:                    # are searched in its trials only, as `family:key`
        base: {schedule: {kind: poly}}
        params: {optimizer.lr: {type: loguniform, low: 1.0e-3, high: 3.0e-2}}
      schedulefree:
        base: {optimizer: {name: schedulefree_adamw}, schedule: {kind: constant}}
        params: {optimizer.lr: {type: loguniform, low: 3.0e-3, high: 1.0e-1}}
    points_to_evaluate:           # trials to run first, each giving every searched param
      - {optimizer.lr: 3.0e-3, schedule.gamma: 0.5, window.microbatches: 1, schedule.kind: poly}

A space is validated completely before anything starts: besides its own keys and types, the
training config is built at both ends of every range and with every choice, so a range that
leaves a key's valid values is reported with the file and the key; every point to evaluate
gives every searched param a value inside its range; the budget (what every trial is compared
at) and checkpointing (which changes no result) are not searched. Searching `ema.objective`
adds the sampled fraction to the EMA bank.

With `families`, a trial's values hold `family` (its name) and, besides the shared `params`,
its own family's params named `family:key` (`anytime:optimizer.lr`): a parameter belongs to
one family, so the sampler never learns from a value a trial of another family ignored
(conditional parameters in Optuna's terms). A family's `base` is merged over the space's.
Adding a family is a YAML entry; nothing in the code names one.
"""

from __future__ import annotations

import copy
import itertools
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from schedule_search.core.averaging import DEFAULT_FRACTIONS
from schedule_search.core.config import (
    PLAIN_NAME,
    STRICT,
    ConfigError,
    InputWarning,
    is_plain_name,
    load_yaml,
    parse,
    to_dict,
)
from schedule_search.core.schedules import HORIZON_AWARE
from schedule_search.store.experiment import FAMILY
from schedule_search.sweep.param import Param
from schedule_search.tasks.registry import build_task
from schedule_search.train.config import TrainConfig

__all__ = [
    "FAMILY",
    "STARTUP_TRIALS",
    "UNSEARCHABLE",
    "Family",
    "Param",
    "SearchSpace",
    "config_key",
    "each_family",
    "load_space",
    "located",
    "schedule_kinds",
    "searched",
    "set_dotted",
    "shardings",
    "short_name",
    "trial_config",
    "uses_asha",
    "value_text",
]

STARTUP_TRIALS = 4  # bench/search.py measures this against Optuna's default of 10
#: What joins a family to its params' keys (`anytime:optimizer.lr`).
OWNED_BY = ":"


@dataclass
class Family:
    """One horizon-free family: what it fixes over the space's base (an optimizer, a schedule
    kind) and what it searches, in its own trials only."""

    __pydantic_config__ = STRICT

    base: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Param] = field(default_factory=dict)


@dataclass
class SearchSpace:
    __pydantic_config__ = STRICT

    name: str = "sweep"
    samples: Annotated[int, Field(gt=0)] = 8
    seed: Annotated[int, Field(ge=0)] = 0
    startup_trials: Annotated[int, Field(ge=1)] = STARTUP_TRIALS
    sampler: Literal["tpe", "gp", "random"] = "tpe"
    scheduler: Literal["auto", "asha", "fifo"] = "auto"
    #: ASHA's first rung in Chinchilla multiples, one of the milestones below the horizon;
    #: None: 1x if it is one, else the first (`bench/family_search.py` measured the choice).
    first_rung: Annotated[float, Field(gt=0)] | None = None
    base: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Param] = field(default_factory=dict)
    points_to_evaluate: list[dict[str, Any]] = field(default_factory=list)
    objectives: list[Literal["val_loss", "wall_s"]] = field(default_factory=lambda: ["val_loss"])
    families: dict[str, Family] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not is_plain_name(self.name):
            raise ValueError(f"name: expected {PLAIN_NAME}, got {self.name!r}")
        for family in self.families:
            if not is_plain_name(family):
                raise ValueError(
                    f"families: a family's name: expected {PLAIN_NAME}, got {family!r}"
                )
        if FAMILY in self.params:
            raise ValueError(f"params.{FAMILY}: the family is searched by `families`, not params")
        for family, owned in self.families.items():
            fixed = sorted(set(owned.base) & {*UNSEARCHABLE, "task"})
            if fixed:
                raise ValueError(
                    f"families.{family}.base.{fixed[0]}: the same for every trial; set it in "
                    "the space's base"
                )
            shared = sorted(set(owned.params) & set(self.params))
            if shared:
                raise ValueError(
                    f"families.{family}.params.{shared[0]}: searched in params already (a key "
                    "is either shared by every family or a family's own)"
                )
        if not self.objectives or self.objectives[0] != "val_loss":
            raise ValueError(f"objectives: must start with val_loss, got {self.objectives}")
        if len(set(self.objectives)) != len(self.objectives):
            raise ValueError(f"objectives: duplicates in {self.objectives}")


def value_text(value: Any, digits: int = 4) -> str:
    """A sampled value as tables and the live view show it: floats to `digits` significant
    digits, anything else as it is."""
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set `key` (dotted sections; a number indexes a list the base gives, as in
    `optimizer.betas.0`) in `tree`."""
    *parents, last = key.split(".")
    node: Any = tree
    for part in parents:
        child = node.setdefault(part, {}) if isinstance(node, dict) else None
        if not isinstance(child, (dict, list)):
            raise ConfigError(f"{key}: {part} is not a section")
        node = child
    if isinstance(node, list):
        if not last.isdigit() or int(last) >= len(node):
            raise ConfigError(f"{key}: {last} is not an index of the list the base gives")
        node[int(last)] = value
    else:
        node[last] = value


def searched(space: SearchSpace, family: str | None = None) -> dict[str, Param]:
    """The names a trial's values hold, each with its distribution: the shared params and, in
    a space with families, `family` and the params of `family` (of every family when None)."""
    names = dict(space.params)
    if space.families:
        names[FAMILY] = Param(type="choice", values=list(space.families))
    for name, owned in space.families.items():
        if family in (None, name):
            names |= {f"{name}{OWNED_BY}{key}": p for key, p in owned.params.items()}
    return names


def _merge(tree: dict[str, Any], over: dict[str, Any]) -> None:
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(tree.get(key), dict):
            _merge(tree[key], value)
        else:
            tree[key] = copy.deepcopy(value)


def trial_config(space: SearchSpace, values: dict[str, Any], source: str = "space") -> TrainConfig:
    """The training config of one trial: the space's base, its family's base merged over it,
    with the sampled values set."""
    tree = copy.deepcopy(space.base)
    family = values.get(FAMILY)
    if family is not None:
        if family not in space.families:
            raise ConfigError(
                f"{source}: {FAMILY}: expected one of {list(space.families)}, got {family!r}"
            )
        _merge(tree, space.families[family].base)
    for key, value in values.items():
        owner, _, dotted = key.rpartition(OWNED_BY)
        if key == FAMILY:
            continue
        if owner and owner != family:
            raise ConfigError(f"{source}: {key}: a param of family {owner}, not of {family}")
        set_dotted(tree, dotted, value)
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
    not (a finished sweep read on another machine, or after its data moved). A space with
    families is checked family by family, as its trials are built."""
    source = str(path)
    space = parse(SearchSpace, load_yaml(path), source)
    if not space.params and not space.families:
        raise ConfigError(f"{source}: params: nothing to search; give at least one key")
    if space.families and space.sampler == "gp":
        warnings.warn(
            f"{source}: sampler: gp does not model a space whose params depend on the family "
            "(Optuna's GPSampler samples each family's own params at random); tpe does",
            InputWarning,
            stacklevel=2,
        )
    built: list[Any] = []
    for family in each_family(space):
        fixed = {FAMILY: family} if family else {}
        try:
            base = trial_config(space, fixed, source)
        except ConfigError as err:
            raise ConfigError(f"{err} (in family {family})" if family else str(err)) from None
        if check_task and base.task not in built:  # the task's own options and data
            build_task(base.task, base.seed, source)
            built.append(base.task)
        params = {k: p for k, p in searched(space, family).items() if k != FAMILY}
        for key, param in params.items():
            _check_searchable(source, key)
            for value in param.corners():
                try:
                    config = trial_config(space, {**fixed, key: value}, source)
                    if check_task and config_key(key).startswith("task."):
                        build_task(config.task, config.seed, source)
                except ConfigError as err:
                    raise ConfigError(f"{err} (from {located(key)} = {value!r})") from None
        _check_pairs(space, params, fixed, source)
    for i, point in enumerate(space.points_to_evaluate):
        _check_point(space, point, f"{source}: points_to_evaluate[{i}]")
    if space.first_rung is not None:
        rungs = trial_config(space, {}, source).budget.milestones()[:-1]
        if space.first_rung not in rungs:
            expected = f"one of {', '.join(f'{m:g}' for m in rungs)}" if rungs else "none"
            raise ConfigError(
                f"{source}: first_rung: {space.first_rung:g} is not a milestone below the "
                f"horizon; expected {expected} (budget.eval_at)"
            )
    if space.scheduler == "asha" and schedule_kinds(space) & set(HORIZON_AWARE):
        raise ConfigError(
            f"{source}: scheduler: asha stops trials early, which is only valid for horizon-free "
            "schedules (constant, poly); use fifo for cosine, linear or wsd"
        )
    return space


def each_family(space: SearchSpace) -> list[str | None]:
    """Each family's name; None alone for a space without families."""
    return [*space.families] or [None]


def config_key(name: str) -> str:
    """A searched name's training config key (`anytime:optimizer.lr` -> `optimizer.lr`)."""
    return name.rpartition(OWNED_BY)[2]


def short_name(name: str) -> str:
    """A searched name as tables show it: the last part of its config key, with the list it
    indexes (`schedulefree:optimizer.betas.0` -> `betas.0`)."""
    *_, parent, last = ["", *config_key(name).split(".")]
    return f"{parent}.{last}" if last.isdigit() else last


def located(name: str) -> str:
    """Where a searched name is written in the space file."""
    owner, _, key = name.rpartition(OWNED_BY)
    return f"families.{owner}.params.{key}" if owner else f"params.{key}"


def _check_pairs(
    space: SearchSpace, params: dict[str, Param], fixed: dict[str, Any], source: str
) -> None:
    """Every pair of searched keys at their corners makes a valid config, so that no sampled
    combination (`sharding: fsdp` with `window.policy: grad_norm`, say) fails mid-sweep."""
    for (key, param), (other, other_param) in itertools.combinations(params.items(), 2):
        for value, other_value in itertools.product(param.corners(), other_param.corners()):
            try:
                trial_config(space, {**fixed, key: value, other: other_value}, source)
            except ConfigError as err:
                raise ConfigError(
                    f"{err} (from {located(key)} = {value!r} with {located(other)} = "
                    f"{other_value!r})"
                ) from None


#: Sections a search may not vary, and why.
UNSEARCHABLE = {
    "budget": "every trial is compared at the same budget (set base.budget, or sweep --horizon)",
    "checkpoint": "checkpointing changes no result",
}


def _check_searchable(source: str, name: str) -> None:
    key = config_key(name)
    section = key.split(".")[0]
    if key.startswith("base.") or section not in TrainConfig.__dataclass_fields__:
        raise ConfigError(f"{source}: {located(name)}: not a training config key")
    if section in UNSEARCHABLE:
        raise ConfigError(f"{source}: {located(name)}: not searchable; {UNSEARCHABLE[section]}")


def _check_point(space: SearchSpace, point: dict[str, Any], where: str) -> None:
    """A point to evaluate is a whole trial: every searched param (of its family), each within
    its range."""
    names = searched(space, point.get(FAMILY)) if space.families else space.params
    if space.families and point.get(FAMILY) not in space.families:
        family = point.get(FAMILY)
        raise ConfigError(
            f"{where}.{FAMILY}: expected one of {list(space.families)}, got {family!r}"
        )
    unknown = sorted(set(point) - set(names))
    if unknown:
        raise ConfigError(f"{where}: {unknown[0]} is not a searched param")
    missing = [key for key in names if key not in point]
    if missing:
        raise ConfigError(f"{where}: {missing[0]} is missing; a point gives every searched param")
    for key, value in point.items():
        param = names[key]
        if not param.contains(value):
            raise ConfigError(f"{where}.{key}: expected {param.describe()}, got {value!r}")
    trial_config(space, point, where)


def _choices(space: SearchSpace, key: str) -> set[Any]:
    """The values the training config key `key` takes across a space's trials: fixed in the
    base or a family's base, or searched (shared, or in a family)."""
    found: set[Any] = set()
    for family in each_family(space):
        config = trial_config(space, {FAMILY: family} if family else {})
        found.add(_get_dotted(to_dict(config), key))
    for name, param in searched(space).items():
        if config_key(name) == key:
            found |= set(param.corners())
    return found


def _get_dotted(tree: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        tree = tree[part]
    return tree


def schedule_kinds(space: SearchSpace) -> set[str]:
    """The schedule kinds a space's trials may use."""
    return {str(kind) for kind in _choices(space, "schedule.kind")}


def shardings(space: SearchSpace) -> set[str]:
    """The `sharding` values a space's trials may take (fixed in base, or searched)."""
    return {str(value) for value in _choices(space, "sharding")}


def uses_asha(space: SearchSpace) -> bool:
    if space.scheduler != "auto":
        return space.scheduler == "asha"
    return schedule_kinds(space) <= {"constant", "poly"}
