"""The exported recipe: what a sweep found, for a plain torch training loop (no Ray needed).

    from schedule_search.recipe import load_recipe
    recipe = load_recipe("recipe.yaml")
    optimizer = recipe.optimizer(model.parameters())   # AdamW at the recipe's peak LR
    recipe.lr_multiplier(t)                            # t in reference steps -> float
    ema = recipe.ema(model)                            # EMA bank with the recipe's fraction(s)
    window = recipe.window(model)                      # accumulator with the recipe's policy
    scheduler = recipe.lr_scheduler(optimizer, tokens_per_step=...)  # a torch LRScheduler
    with recipe.evaluation_weights(optimizer, ema): ...  # the weights the recipe is scored at

A model sharded with FSDP2 (`fully_shard`) gets a sharded window and an EMA bank over its
local shards (`core.sharding`); `recipe.spec.sharding` records which the sweep trained with.

Param groups with their own LR keep their ratio to the optimizer's default LR at every window
(`WindowAccumulator.close`); frozen parameters are left out of the window and the EMAs.

`recipe.clock(tokens)` turns tokens seen into t. The schedule is kept in Chinchilla multiples,
so `load_recipe(path, n_params=...)` carries it over to another model size.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any

import torch
import yaml
from pydantic import Field

from schedule_search.core.averaging import EmaBank, EmaConfig
from schedule_search.core.clock import TokenClock
from schedule_search.core.config import STRICT, ConfigError, load_yaml, parse, to_dict
from schedule_search.core.files import atomic_write_text
from schedule_search.core.optimizer import OptimizerConfig, evaluation_weights
from schedule_search.core.schedules import ScheduleConfig
from schedule_search.core.sharding import ShardedGradients, Sharding, is_sharded
from schedule_search.core.window import WindowAccumulator, WindowConfig
from schedule_search.recipe.scheduler import RecipeLRScheduler

__all__ = ["RECIPE_FORMAT", "Recipe", "RecipeSpec", "load_recipe", "write_recipe"]

RECIPE_FORMAT = 1


@dataclass
class RecipeSpec:
    """The recipe file's contents. `objective` and `source` say where it came from; `family`
    names the sweep's family the recipe is of (None in files of a space without families)."""

    __pydantic_config__ = STRICT

    format: Annotated[int, Field(ge=RECIPE_FORMAT, le=RECIPE_FORMAT)]
    optimizer: OptimizerConfig
    schedule: ScheduleConfig
    ema: EmaConfig
    window: WindowConfig
    n_params: Annotated[int, Field(gt=0)]
    tokens_per_param: Annotated[float, Field(gt=0)]
    tokens_per_reference_step: Annotated[float, Field(gt=0)]
    objective: dict[str, Any] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    sharding: Sharding = "replicated"
    family: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.ema.objective, float):
            raise ValueError(
                "ema.objective: a recipe names the EMA fraction to evaluate with (a number "
                f"in ema.fractions), got {self.ema.objective!r}"
            )


class Recipe:
    """Builds the optimizer, LR multiplier, EMA bank and window accumulator of a recipe."""

    def __init__(self, spec: RecipeSpec) -> None:
        self.spec = spec
        self.token_clock = TokenClock(
            spec.n_params, spec.tokens_per_param, spec.tokens_per_reference_step
        )
        self.schedule = spec.schedule.build(self.token_clock.steps_per_chinchilla)
        self._optimizers: list[torch.optim.Optimizer] = []

    @property
    def peak_lr(self) -> float:
        return self.spec.optimizer.lr

    @property
    def ema_fraction(self) -> float:
        """The EMA fraction whose loss the sweep optimized: evaluate with this one."""
        return float(self.spec.ema.objective)  # a number: `RecipeSpec` refuses `best`

    @property
    def how_to_evaluate(self) -> str:
        """One line: which weights the recipe's loss was measured at, and how to get them."""
        ema = (
            "the raw weights"
            if self.ema_fraction == 0
            else f"the EMA of fraction {self.ema_fraction:g} swapped in"
        )
        if self.spec.optimizer.name == "schedulefree_adamw":
            return (
                "schedule-free AdamW: evaluate at its averaged weights (optimizer.eval() "
                f"before, optimizer.train() after) with {ema}: "
                "`with recipe.evaluation_weights(optimizer, ema):`"
            )
        return f"evaluate with {ema}: `with recipe.evaluation_weights(optimizer, ema):`"

    @contextlib.contextmanager
    def evaluation_weights(self, optimizer: torch.optim.Optimizer, ema: EmaBank) -> Iterator[None]:
        """The model holds the weights the recipe was scored at inside the block: schedule-free
        AdamW's averaged weights (its own eval/train switch; other optimizers change nothing),
        then EMA `ema_fraction` in place. After it the training point is back bit for bit."""
        with evaluation_weights(optimizer), ema.swapped_in(self.ema_fraction):
            yield

    def clock(self, tokens: float) -> float:
        """t, in reference steps, after `tokens` tokens."""
        return self.token_clock.steps(tokens)

    def lr_multiplier(self, t: float) -> float:
        return self.schedule(t)

    def optimizer(self, params: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
        built = self.spec.optimizer.build(list(params))
        self._optimizers.append(built)
        return built

    def lr_scheduler(
        self, optimizer: torch.optim.Optimizer, tokens_per_step: float
    ) -> RecipeLRScheduler:
        """A torch `LRScheduler` for a trainer that steps one: call `scheduler.step()` after
        each `optimizer.step()`. Step k gets the LR the recipe gives after
        `k * tokens_per_step` tokens (`schedule_search.recipe.scheduler`); it saves and loads with
        `state_dict()` like any torch scheduler."""
        return RecipeLRScheduler(
            optimizer, self.schedule, self.token_clock, self.peak_lr, tokens_per_step
        )

    def ema(self, model: torch.nn.Module) -> EmaBank:
        """The bank over the model's trainable parameters and float buffers (`EmaBank.of`);
        over this rank's shards of them for a sharded model."""
        return EmaBank.of(model, self.spec.ema.fractions)

    def window(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
    ) -> WindowAccumulator:
        """The accumulator for `model`. It steps `optimizer`, by default the one this recipe
        built for the model's trainable parameters (call `recipe.optimizer(...)` first; it may
        hold the frozen ones too, or not)."""
        params = [p for p in model.parameters() if p.requires_grad]
        if optimizer is None:
            owned = {id(p) for p in params}

            def trains(built: torch.optim.Optimizer) -> set[int]:
                return {id(p) for g in built.param_groups for p in g["params"] if p.requires_grad}

            matches = [o for o in self._optimizers if trains(o) == owned]
            if not matches:
                raise ValueError(
                    "no optimizer for this model: call recipe.optimizer(model.parameters()) "
                    "first, or pass optimizer="
                )
            optimizer = matches[-1]
        gradients = None
        if is_sharded(model):
            gradients = ShardedGradients.for_window(model, params, self.spec.window)
        return WindowAccumulator(params, optimizer, self.spec.window, gradients=gradients)


def load_recipe(path: str | Path, n_params: int | None = None) -> Recipe:
    """Load a recipe file; `n_params` rescales its Chinchilla-relative schedule to your model."""
    spec = parse(RecipeSpec, load_yaml(path), str(path))
    if n_params is not None:
        if n_params <= 0:
            raise ConfigError(f"n_params: expected a positive parameter count, got {n_params}")
        spec = replace(spec, n_params=n_params)
    return Recipe(spec)


def write_recipe(path: str | Path, spec: RecipeSpec) -> None:
    """Write a recipe atomically (a reader never sees half a file)."""
    data = to_dict(spec)
    text = "# schedule-search recipe: load with schedule_search.recipe.load_recipe\n"
    text += f"# {Recipe(spec).how_to_evaluate}\n"
    atomic_write_text(Path(path), text + yaml.safe_dump(data, sort_keys=False))
