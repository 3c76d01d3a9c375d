"""The paper's proxy: linear regression with power-law spectrum and target.

Features x ~ N(0, diag(lambda)) with lambda_i = i^-a; the target w* has lambda_i w*_i^2 = i^-b;
labels y = <w*, x> + N(0, noise). One sample is one "token". Evaluation is the exact excess
risk (w - w*)^T diag(lambda) (w - w*), not a sample estimate. Theory (Meterez et al.): the best
horizon-free decay is 1/t^gamma with gamma* = max(0, 1 - a/b).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from pydantic import Field

from schedule_search.core.config import STRICT, parse
from schedule_search.core.sharding import full_tensor
from schedule_search.tasks.protocol import Microbatch, stream_generator

__all__ = ["LinregConfig", "LinregTask", "build"]


@dataclass
class LinregConfig:
    __pydantic_config__ = STRICT

    dim: Annotated[int, Field(gt=0)] = 256
    a: Annotated[float, Field(gt=0)] = 1.5
    b: Annotated[float, Field(gt=0)] = 3.0
    noise: Annotated[float, Field(ge=0)] = 0.01
    batch: Annotated[int, Field(gt=0)] = 32
    dtype: Literal["float32", "float64"] = "float32"


class LinregTask:
    def __init__(self, config: LinregConfig, seed: int) -> None:
        self.config = config
        self.seed = seed
        self.dtype = getattr(torch, config.dtype)
        index = torch.arange(1, config.dim + 1, dtype=torch.float64)
        self.eigenvalues = index ** (-config.a)
        self.target = torch.sqrt(index ** (-config.b) / self.eigenvalues)
        self.tokens_per_microbatch = config.batch

    def build_model(self) -> torch.nn.Module:
        model = torch.nn.Linear(self.config.dim, 1, bias=False, dtype=self.dtype)
        torch.nn.init.zeros_(model.weight)
        return model

    def chinchilla_params(self, model: torch.nn.Module) -> int:
        return self.config.dim

    def sample(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.randn(n, self.config.dim, generator=generator, dtype=torch.float64)
        x = z * self.eigenvalues.sqrt()
        y = x @ self.target + self.config.noise**0.5 * torch.randn(
            n, generator=generator, dtype=torch.float64
        )
        return x.to(self.dtype), y.to(self.dtype)

    def microbatch(self, index: int, rank: int, world_size: int) -> Microbatch:
        generator = stream_generator(self.seed, index, rank, world_size)
        return Microbatch(self.sample(self.config.batch, generator), self.config.batch)

    def loss_sum(self, model: torch.nn.Module, batch: Microbatch) -> torch.Tensor:
        device = model.weight.device
        x, y = (z.to(device, non_blocking=True) for z in batch.data)
        return ((model(x).squeeze(-1) - y) ** 2).sum()

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module) -> float:
        weight = full_tensor(next(model.parameters()).detach())  # sharded: every rank gathers
        w = weight.to("cpu", torch.float64).reshape(-1)
        delta = w - self.target
        return float(torch.sum(self.eigenvalues * delta**2))


def build(options: Mapping[str, Any], seed: int, source: str = "task") -> LinregTask:
    return LinregTask(parse(LinregConfig, options, source, "task"), seed)
