"""The optimizer a run steps, and the weights it is evaluated with."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

import torch
from pydantic import Field

from schedule_search.core.config import STRICT, ConfigError, Positive
from schedule_search.core.sharding import local_tensors

__all__ = ["SCHEDULE_FREE_LR", "OptimizerConfig", "evaluation_weights"]

#: Schedule-free AdamW's LR over AdamW's for the same run. Its README: "a good starting point
#: is 1x to 10x larger than schedule-based approaches"; this is the geometric middle of that
#: range (the transfer's schedule-free grid centre, the AdamW references' LR for a
#: schedule-free recipe, and the LR the forecast gives those references).
SCHEDULE_FREE_LR = math.sqrt(10.0)


@dataclass
class OptimizerConfig:
    """AdamW (weight decay 0 by default, as in the paper), SGD, or schedule-free AdamW
    (Defazio et al. 2024, the `schedulefree` package), at peak LR `lr`.

    Schedule-free AdamW keeps its averaged weights inside the optimizer and is evaluated with
    them (`evaluation_weights`); run it with a constant schedule (warmup included: the LR the
    loop sets is the one it steps with). Its average weighs every optimizer step alike, so
    with windows of variable length a step of few tokens counts as much as a long one."""

    __pydantic_config__ = STRICT

    name: Literal["adamw", "sgd", "schedulefree_adamw"] = "adamw"
    lr: Positive = 3e-3
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (
        0.9,
        0.95,
    )
    eps: Positive = 1e-8
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    momentum: Annotated[float, Field(ge=0, lt=1)] = 0.0

    def build(self, params: Sequence[torch.Tensor]) -> torch.optim.Optimizer:
        if self.name == "sgd":
            return torch.optim.SGD(
                params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay
            )
        if self.name == "schedulefree_adamw":
            try:
                from schedulefree import AdamWScheduleFree
            except ModuleNotFoundError:
                raise ConfigError(
                    "optimizer.name: schedulefree_adamw needs the schedulefree package "
                    "(pip install schedulefree, or the sweep extra)"
                ) from None

            optimizer = AdamWScheduleFree(
                params, lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay
            )
            optimizer.train()
            return optimizer
        return torch.optim.AdamW(
            params, lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay
        )


@contextlib.contextmanager
def evaluation_weights(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """The model holds the weights it is evaluated with inside this block: for schedule-free
    AdamW its averaged weights x (its `eval()` switch); after it, the training point y comes
    back bit for bit (copied back, not recomputed by `train()`'s interpolation, so a rank that
    evaluated stays identical to one that did not). Other optimizers leave the weights alone."""
    switch = getattr(optimizer, "eval", None)
    if switch is None:
        yield
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    training_point = [p.detach().clone() for p in params]
    switch()
    try:
        yield
    finally:
        optimizer.train()  # type: ignore[attr-defined]
        with torch.no_grad():  # on local shards where sharded (no DTensor foreach copy)
            torch._foreach_copy_(local_tensors(params), local_tensors(training_point))
