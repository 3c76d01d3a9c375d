"""What is trained. A task supplies a model, deterministic micro-batches, a token-summed loss
and a held-out evaluation; the trainer does the rest.

The task protocol (what a user task provides; see `Task`):
- `build_model()` -> `torch.nn.Module`, identical on every rank for a given seed.
- `chinchilla_params(model)` -> the parameter count 1x Chinchilla is measured in (by
  convention the non-embedding parameters).
- `microbatch(index, rank, world_size)` -> `Microbatch`: a deterministic function of its
  arguments and the task's seed, so a resumed run sees exactly the data it would have seen.
- `loss_sum(model, batch)` -> the loss *summed* over the micro-batch's tokens (a 0-dim tensor);
  it moves the batch to the model's device (micro-batches are made on the CPU).
- `evaluate(model)` -> the mean held-out loss per token (a float), deterministic.
- `tokens_per_microbatch`: the nominal tokens of one micro-batch on one rank.

A user task is named `package.module:factory` in a config; the factory is called as
`factory(seed=seed, **options)` with the remaining keys of the task section.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from schedule_search.config import ConfigError


@dataclass(frozen=True)
class Microbatch:
    """One micro-batch: task-specific `data` and the number of tokens the loss sums over."""

    data: Any
    tokens: int


@runtime_checkable
class Task(Protocol):
    tokens_per_microbatch: int

    def build_model(self) -> torch.nn.Module: ...

    def chinchilla_params(self, model: torch.nn.Module) -> int: ...

    def microbatch(self, index: int, rank: int, world_size: int) -> Microbatch: ...

    def loss_sum(self, model: torch.nn.Module, batch: Microbatch) -> torch.Tensor: ...

    def evaluate(self, model: torch.nn.Module) -> float: ...


def _builtin(name: str) -> Callable[..., Task] | None:
    if name == "linreg":
        from schedule_search.tasks import linreg

        return linreg.build
    if name == "tinylm":
        from schedule_search.tasks import tinylm

        return tinylm.build
    return None


BUILTIN_TASKS = ("linreg", "tinylm")


def build_task(spec: Mapping[str, Any], seed: int, source: str = "config") -> Task:
    """Build a task from a config section: `{name: linreg|tinylm|module:factory, ...options}`."""
    if not isinstance(spec, Mapping) or "name" not in spec:
        raise ConfigError(f"{source}: task.name: required key is missing")
    options = {k: v for k, v in spec.items() if k != "name"}
    name = spec["name"]
    builtin = _builtin(name) if isinstance(name, str) else None
    if builtin is not None:
        return builtin(options, seed=seed, source=source)
    factory = _import_factory(name, source)
    try:
        task = factory(seed=seed, **options)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{source}: task: {name} refused its options: {err}") from None
    if not isinstance(task, Task):
        raise ConfigError(f"{source}: task.name: {name} did not return a Task (see the protocol)")
    return task


def _import_factory(name: Any, source: str) -> Callable[..., Task]:
    expected = f"one of {', '.join(BUILTIN_TASKS)} or 'package.module:factory'"
    if not isinstance(name, str) or name.count(":") != 1:
        raise ConfigError(f"{source}: task.name: expected {expected}, got {name!r}")
    module_name, attribute = name.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(f"{source}: task.name: cannot import {module_name!r} ({err})") from None
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise ConfigError(f"{source}: task.name: {module_name} has no callable {attribute!r}")
    return factory


def task_code(spec: Mapping[str, Any]) -> Path | None:
    """Where a user's task module lives (its file, or its top-level package's folder), for Ray
    to ship to workers that do not have it (`runtime_env` `py_modules`); None for the built-in
    tasks and for modules installed in site-packages (install those on the cluster too)."""
    name = spec.get("name") if isinstance(spec, Mapping) else None
    if not isinstance(name, str) or name in BUILTIN_TASKS or ":" not in name:
        return None
    top = importlib.import_module(name.split(":")[0].split(".")[0])
    origin = getattr(top, "__file__", None)
    if origin is None:
        return None
    path = Path(origin).parent if Path(origin).name == "__init__.py" else Path(origin)
    if {"site-packages", "dist-packages"} & set(path.parts):
        return None
    return path


def seeded_generator(*keys: int) -> torch.Generator:
    """A torch generator seeded from integer keys (seed, rank, index, ...; all >= 0),
    stable across runs and machines."""
    import numpy as np

    state = np.random.SeedSequence([int(k) for k in keys]).generate_state(2, dtype=np.uint64)
    return torch.Generator().manual_seed(int(state[0] >> np.uint64(1)))
