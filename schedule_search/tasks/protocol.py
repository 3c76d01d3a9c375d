"""The task protocol: what is trained. A task supplies a model, deterministic micro-batches,
a token-summed loss and a held-out evaluation; the trainer does the rest.

The task protocol (what a user task provides; see `Task`):
- `build_model()` -> `torch.nn.Module`, identical on every rank for a given seed.
- `chinchilla_params(model)` -> the parameter count 1x Chinchilla is measured in (by
  convention the non-embedding parameters).
- `microbatch(index, rank, world_size)` -> `Microbatch`: a deterministic function of its
  arguments and the task's seed, so a resumed run sees exactly the data it would have seen.
  The built-in tasks take draw number `index * world_size + rank` of one stream
  (`stream_generator`), so 1 rank x 2 micro-batches a window and 2 ranks x 1 train on the
  same data: a recipe's result does not depend on how its window is split over workers.
- `loss_sum(model, batch)` -> the loss *summed* over the micro-batch's tokens (a 0-dim tensor);
  it moves the batch to the model's device (micro-batches are made on the CPU).
- `evaluate(model)` -> the mean held-out loss per token (a float), deterministic.
- `tokens_per_microbatch`: the nominal tokens of one micro-batch on one rank.

A user task is named `package.module:factory` in a config; the factory is called as
`factory(seed=seed, **options)` with the remaining keys of the task section.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["Microbatch", "Task", "seeded_generator", "stream_generator"]


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


def seeded_generator(*keys: int) -> torch.Generator:
    """A torch generator seeded from integer keys (a seed, a draw number, ...; all >= 0),
    stable across runs and machines."""
    import numpy as np

    state = np.random.SeedSequence([int(k) for k in keys]).generate_state(2, dtype=np.uint64)
    return torch.Generator().manual_seed(int(state[0] >> np.uint64(1)))


def stream_generator(seed: int, index: int, rank: int, world_size: int) -> torch.Generator:
    """The generator of micro-batch `index` of `rank` among `world_size`: draw number
    `index * world_size + rank` of the seed's one stream. In a `microbatches` window every rank
    is at the same index, so window w of a run with R ranks x M micro-batches draws numbers
    w*R*M to (w+1)*R*M - 1, whatever R and M are. One rank's draws are those a run had before
    the stream was shared (keys seed, 0, index): single-rank results are unchanged."""
    return seeded_generator(seed, 0, index * world_size + rank)
