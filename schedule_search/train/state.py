"""Where a run stands, and the checkpoint that lets it resume exactly: weights, optimizer,
EMA bank, window (token clock), data position and every rank's RNG, taken at a window
boundary. A sharded (FSDP) run's checkpoint holds the same full tensors as a replicated one's
(gathered at the save, cut to shards at the restore), so either resumes the other."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from schedule_search.core.averaging import EmaBank, averaged_tensors
from schedule_search.core.sharding import (
    full_ema_state,
    full_state,
    is_sharded,
    load_full_state,
    local_ema_state,
)
from schedule_search.core.states import State
from schedule_search.core.window import WindowAccumulator

__all__ = ["CHECKPOINT_FORMAT", "Progress", "TrainResult", "Trainee", "restore", "snapshot"]

CHECKPOINT_FORMAT = 1


@dataclass
class Progress:
    """Where the run stands; saved in every checkpoint."""

    data_position: int = 0  # micro-batches this rank has drawn so far
    milestone: int = 0  # index of the next evaluation point
    wall_s: float = 0.0  # wall-clock seconds spent, summed over resumed runs
    eval_s: float = 0.0  # of which in evaluation, checkpoints and reports
    history: list[dict[str, Any]] = field(default_factory=list)  # `Evaluation.to_metrics()`s
    status: State = State.RUNNING
    reason: str = ""

    def __post_init__(self) -> None:
        self.status = State(self.status)


@dataclass
class TrainResult:
    status: State
    history: list[dict[str, Any]]
    reason: str = ""

    @property
    def final(self) -> dict[str, Any]:
        return self.history[-1] if self.history else {}


@dataclass
class Trainee:
    """What a checkpoint holds the state of."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    window: WindowAccumulator
    ema: EmaBank


def snapshot(trainee: Trainee, progress: Progress, rank: int, world_size: int) -> dict[str, Any]:
    """Everything a resumed run needs, with what each rank alone holds (a collective): its RNG,
    its data position (ranks may draw different numbers of micro-batches: `seconds` and
    `tokens` windows) and its window's error-feedback residuals."""
    mine = {
        "rng": torch.get_rng_state(),
        "data_position": progress.data_position,
        "window": trainee.window.rank_state_dict(),
    }
    ranks: list[Any] = [mine]
    if world_size > 1:
        ranks = [None] * world_size
        dist.all_gather_object(ranks, mine)
    saved = asdict(progress)
    saved["status"] = str(progress.status)
    model, optimizer, ema = _full_states(trainee)
    return {
        "format": CHECKPOINT_FORMAT,
        "model": model,
        "optimizer": optimizer,
        "ema": ema,
        "window": trainee.window.state_dict(),
        "progress": saved,
        "rng": [r["rng"] for r in ranks],
        "ranks": [{k: v for k, v in r.items() if k != "rng"} for r in ranks],
        "world_size": world_size,
    }


def restore(state: dict[str, Any], trainee: Trainee, rank: int, world_size: int) -> Progress:
    """Load a snapshot into `trainee`; this rank's RNG, data position and residuals come back
    when the world size is the one it was saved with (otherwise every rank takes rank 0's
    position and starts with no residual)."""
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint format {state.get('format')} is not {CHECKPOINT_FORMAT}")
    if is_sharded(trainee.model):
        load_full_state(trainee.model, trainee.optimizer, state["model"], state["optimizer"])
        trainee.ema.load_state_dict(local_ema_state(state["ema"], averaged_tensors(trainee.model)))
    else:
        trainee.model.load_state_dict(state["model"])
        trainee.optimizer.load_state_dict(state["optimizer"])
        trainee.ema.load_state_dict(state["ema"])
    trainee.window.load_state_dict(state["window"])
    progress = Progress(**state["progress"])
    if state["world_size"] == world_size:
        torch.set_rng_state(state["rng"][rank])
        progress.data_position = int(state["ranks"][rank]["data_position"])
        trainee.window.load_rank_state_dict(state["ranks"][rank]["window"])
    return progress


def _full_states(trainee: Trainee) -> tuple[dict, dict, dict]:
    """The model's, optimizer's and EMA bank's state dicts of full tensors (sharded: gathered,
    a collective; the model's and optimizer's on rank 0 alone)."""
    if not is_sharded(trainee.model):
        return trainee.model.state_dict(), trainee.optimizer.state_dict(), trainee.ema.state_dict()
    model, optimizer = full_state(trainee.model, trainee.optimizer)
    return (
        model,
        optimizer,
        full_ema_state(trainee.ema.state_dict(), averaged_tensors(trainee.model)),
    )
