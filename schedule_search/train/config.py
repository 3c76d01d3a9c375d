"""What one training run is: the task, optimizer, schedule, EMA bank, window, budget and
checkpoints, as one typed config (a YAML file, a sweep trial, or a transfer run)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from schedule_search.core.averaging import EmaConfig
from schedule_search.core.config import STRICT, ConfigError, Positive, load_yaml, parse
from schedule_search.core.optimizer import OptimizerConfig
from schedule_search.core.schedules import ScheduleConfig
from schedule_search.core.sharding import Sharding, check_window
from schedule_search.core.window import WindowConfig

__all__ = [
    "BudgetConfig",
    "CheckpointConfig",
    "TrainConfig",
    "check_workers",
    "load_train_config",
]


@dataclass
class BudgetConfig:
    """How long to train and where to evaluate, in Chinchilla multiples (1x = tokens_per_param
    x the task's Chinchilla parameter count). `tokens_per_reference_step` is the clock's unit
    (default: one micro-batch of one rank); schedules are in the same unit, so it only changes
    how t reads, never the LR a token sees."""

    __pydantic_config__ = STRICT

    horizon: Positive = 4.0
    eval_at: list[Positive] = field(default_factory=lambda: [0.25, 0.5, 1.0, 2.0, 4.0])
    tokens_per_param: Positive = 20.0
    tokens_per_reference_step: Annotated[int, Field(gt=0)] | None = None

    def milestones(self) -> list[float]:
        """Evaluation points up to the horizon, which is always one of them."""
        return sorted({m for m in self.eval_at if m < self.horizon} | {self.horizon})


@dataclass
class CheckpointConfig:
    """Checkpoints are taken at every evaluation point, and every `every_windows` windows
    when that is > 0; only the newest `keep` are kept."""

    __pydantic_config__ = STRICT

    every_windows: Annotated[int, Field(ge=0)] = 0
    keep: Annotated[int, Field(ge=1)] = 2


@dataclass
class TrainConfig:
    __pydantic_config__ = STRICT

    task: dict[str, Any] = field(default_factory=lambda: {"name": "tinylm"})
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    ema: EmaConfig = field(default_factory=EmaConfig)
    window: WindowConfig = field(default_factory=WindowConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    seed: Annotated[int, Field(ge=0)] = 0
    threads: Annotated[int, Field(ge=1)] = 1
    #: `auto`: the session's accelerator if it has one (Ray Train's GPU, or LOCAL_RANK's GPU
    #: under torchrun), else the CPU.
    device: Literal["auto", "cpu"] = "auto"
    #: `auto`: bf16 autocast on a GPU (bf16 over fp16: no loss scaling), fp32 on the CPU.
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    #: `fsdp`: parameters, gradients and AdamW state sharded across the run's workers with
    #: FSDP2 (`core.sharding`: how windows run sharded); `replicated`: each worker holds all.
    sharding: Sharding = "replicated"
    #: `true`: the model compiled in place with `torch.compile` (`nn.Module.compile`), so its
    #: parameters, state_dict keys, checkpoints, EMA bank and windows are the eager run's.
    compile: bool = False
    #: A checkpoint folder of another run to start from: its weights, optimizer, EMAs, clock
    #: and data position, under this run's own schedule and milestones (a WSD branch).
    branch_from: str | None = None

    def __post_init__(self) -> None:
        if "name" not in self.task:
            raise ValueError("task.name: required key is missing")
        if self.sharding == "fsdp":
            check_window(self.window)


def load_train_config(path: str | Path) -> TrainConfig:
    return parse(TrainConfig, load_yaml(path), str(path))


def check_workers(sharding: str, workers: int, source: str) -> None:
    """Refuse, before anything launches, a sharded run with nothing to shard across."""
    if sharding == "fsdp" and workers < 2:
        raise ConfigError(
            f"{source}: sharding: fsdp shards across a run's workers and this one has {workers}; "
            "expected --workers 2 or more, or sharding: replicated"
        )
