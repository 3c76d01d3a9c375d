"""What a run reports at each evaluation point: one typed record, kept in `metrics.json` and
sent to Ray Tune as a flat dict (`to_metrics`/`from_metrics`): every field under its report
name (DESIGN's metric list), each EMA's loss under `loss_key(fraction)`, the state as its word."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.distributed as dist

from schedule_search.core.averaging import EmaBank, EmaConfig, loss_key
from schedule_search.core.clock import TokenClock
from schedule_search.core.optimizer import evaluation_weights
from schedule_search.core.sharding import is_sharded, reshard
from schedule_search.core.states import State
from schedule_search.core.window import WindowRecord
from schedule_search.tasks.protocol import Task

__all__ = ["Evaluation", "WindowStats", "evaluate_losses"]

_LOSS_PREFIX = "val_loss_"
#: Fields reported under DESIGN's shorter metric name: in the code `microbatches` is also the
#: data position and the window's length, so the field says which micro-batches it counts.
_REPORTED_AS = {"window_microbatches": "microbatches"}
_FIELD_OF = {reported: name for name, reported in _REPORTED_AS.items()}


@dataclass
class Evaluation:
    """One evaluation point of a run (or the point where it diverged).

    `val_loss` is the objective: the loss of `ema_fraction`'s weights (0 = raw) as the EMA
    config picks it among `losses` (fraction -> held-out loss). Timings are wall-clock seconds
    summed over resumed runs; `train_s` excludes evaluation, checkpoints and reports."""

    tokens: int
    chinchilla: float
    val_loss: float
    status: State = State.RUNNING
    milestone: int = 0  # how many evaluation points the run has passed
    windows: int = 0
    reason: str = ""
    lr: float = math.nan
    n_params: int = 0
    tokens_per_reference_step: float = 0
    ema_fraction: float = math.nan
    losses: dict[float, float] = field(default_factory=dict)
    wall_s: float = 0.0
    eval_s: float = 0.0
    train_s: float = 0.0
    # The windows since the previous evaluation: the last one's gradient norm, the mean
    # throughput, and the mean window (seconds; micro-batches and tokens, summed over ranks).
    grad_norm: float = math.nan
    tokens_per_s: float = math.nan
    window_s: float = math.nan
    window_microbatches: float = math.nan
    window_tokens: float = math.nan

    def loss_at(self, fraction: float) -> float:
        """The held-out loss of EMA `fraction` (0: the raw weights); NaN if not evaluated."""
        exact = self.losses.get(float(fraction))
        # A record read back from metrics.json keys a fraction as its metric name writes it
        # (`{f:g}`, 6 significant digits).
        return exact if exact is not None else self.losses.get(float(f"{fraction:g}"), math.nan)

    def token_clock(self, tokens_per_param: float) -> TokenClock:
        """The token clock of the run that recorded this evaluation."""
        return TokenClock(self.n_params, tokens_per_param, self.tokens_per_reference_step)

    def to_metrics(self) -> dict[str, Any]:
        """The flat dict Tune and `metrics.json` hold: each field under its report name, each
        fraction's loss under `loss_key(fraction)`, the state as its word."""
        metrics: dict[str, Any] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name == "losses":
                metrics.update({loss_key(f): loss for f, loss in value.items()})
            elif item.name == "status":
                metrics["status"] = str(value)
            else:
                metrics[_REPORTED_AS.get(item.name, item.name)] = value
        return metrics

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, Any]) -> Evaluation:
        """A record back from `to_metrics`. Raises KeyError/ValueError on a record that is not
        an evaluation."""
        known = {item.name for item in fields(cls)} - {"losses", "status"}
        values = {
            _FIELD_OF.get(k, k): v for k, v in metrics.items() if _FIELD_OF.get(k, k) in known
        }
        losses = {
            _fraction(key): float(loss)
            for key, loss in metrics.items()
            if key.startswith(_LOSS_PREFIX)
        }
        return cls(**values, losses=losses, status=State(metrics.get("status", State.RUNNING)))


def _fraction(key: str) -> float:
    """The EMA fraction a `loss_key` names."""
    name = key[len(_LOSS_PREFIX) :]
    return 0.0 if name == "raw" else float(name.split("/", 1)[1])


class WindowStats:
    """The windows closed since the last evaluation, summarized into its record."""

    def __init__(self) -> None:
        self.records: list[WindowRecord] = []

    def summarize_into(self, point: Evaluation) -> None:
        """Set `point`'s window fields from the windows since the last call."""
        records, self.records = self.records, []
        if not records:
            return
        seconds = sum(r.seconds for r in records)
        tokens = sum(r.tokens for r in records)
        point.grad_norm = records[-1].grad_norm
        point.tokens_per_s = tokens / seconds if seconds > 0 else math.inf
        point.window_s = seconds / len(records)
        point.window_microbatches = sum(r.microbatches for r in records) / len(records)
        point.window_tokens = tokens / len(records)


def evaluate_losses(
    task: Task,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    ema: EmaBank,
    config: EmaConfig,
    rank: int,
    world_size: int,
    autocast: torch.autocast,
) -> tuple[dict[float, float], float, float]:
    """(losses, ema_fraction, val_loss): the held-out loss of the raw weights and of every
    EMA, and the objective the EMA config picks. Rank 0 evaluates and broadcasts, so every
    rank reports, and decides on divergence from, the same numbers. A sharded model's forward
    gathers from every rank, so there every rank evaluates (the same data, the same weights)."""
    picked: list[Any] = [None]
    if rank == 0 or is_sharded(model):
        losses = {}
        with evaluation_weights(optimizer):
            reshard(model)
            for frac in config.evaluated:
                with ema.swapped_in(frac), autocast:
                    losses[frac] = task.evaluate(model)
                    reshard(model)  # the next forward gathers the next weights swapped in
        picked = [(losses, *config.pick(losses))]
    if world_size > 1:
        dist.broadcast_object_list(picked, src=0)
    return picked[0]
