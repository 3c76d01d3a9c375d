"""EMA bank: several horizon-free EMAs of the weights, updated on the token clock.

Each EMA has a half-life that is a fixed fraction of the run's age: after an update that moved
the clock from t0 to t1, `ema <- tau * ema + (1 - tau) * w` with
`tau = 0.5 ** ((t1 - t0) / (frac * t1))` (the README's Concepts). Counting age on the clock, not in
updates, keeps uneven windows right (as EDM2 counts age in samples). frac = 0 is the raw
weights and costs nothing. One fused `torch._foreach_lerp_` per EMA per update.

Averages are kept in float32 at least, whatever the weights' dtype: a bf16 average rounds away
updates smaller than its 8-bit mantissa's step, which is exactly what a long-half-life EMA
adds each window.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Literal

import torch
from pydantic import Field

from schedule_search.core.config import STRICT
from schedule_search.core.sharding import local_tensors

__all__ = [
    "BEST",
    "DEFAULT_FRACTIONS",
    "EmaBank",
    "EmaConfig",
    "averaged_tensors",
    "ema_decay",
    "ema_key",
    "fraction_label",
    "loss_key",
]

#: The default bank: raw weights and fractions doubling from 0.005 to 0.32, around the paper's
#: headline 0.04 (f = 25) with three doublings on each side. One run reports every fraction's
#: loss, so the fraction costs a search no trials.
DEFAULT_FRACTIONS = (0.0, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32)

#: `objective: best`: the run's objective is the lowest loss in its bank.
BEST = "best"

Fraction = Annotated[float, Field(ge=0, le=1)]


@dataclass
class EmaConfig:
    """Which EMAs a run keeps and which one's loss is its objective."""

    __pydantic_config__ = STRICT

    #: Half-life / age of each EMA kept (0 = the raw weights).
    fractions: list[Fraction] = field(default_factory=lambda: list(DEFAULT_FRACTIONS))
    #: The fraction whose validation loss is the objective (one of `fractions`; the paper's
    #: headline 0.04 by default), or `best`: the lowest loss in the bank at each evaluation,
    #: its fraction reported beside it (what a sweep's spaces use).
    objective: Fraction | Literal["best"] = 0.04

    def __post_init__(self) -> None:
        if len(set(self.fractions)) != len(self.fractions):
            raise ValueError(f"fractions: duplicates in {self.fractions}")
        if not self.fractions:
            raise ValueError("fractions: at least one fraction (0 = the raw weights)")
        if self.objective != BEST and self.objective not in self.fractions:
            raise ValueError(
                f"objective: {self.objective} is not one of fractions {self.fractions} "
                f"(or '{BEST}')"
            )

    @property
    def evaluated(self) -> list[float]:
        """The fractions an evaluation scores: the raw weights always (every record reports
        `val_loss_raw`, which the reports, the forecast and the envelopes read), then the
        bank's own."""
        fractions = [float(f) for f in self.fractions]
        return fractions if 0.0 in fractions else [0.0, *fractions]

    def pick(self, losses: Mapping[float, float]) -> tuple[float, float]:
        """(fraction, loss) of the objective among `fractions` (`losses`: fraction ->
        validation loss, of `evaluated`). `best` takes the lowest finite loss, the smaller
        fraction on a tie; a non-finite loss counts as worst. The raw weights compete only
        when they are one of `fractions`."""
        if self.objective != BEST:
            return float(self.objective), losses[float(self.objective)]

        def rank(frac: float) -> tuple[bool, float, float]:
            finite = math.isfinite(losses[frac])
            return (not finite, losses[frac] if finite else 0.0, frac)

        frac = min((float(f) for f in self.fractions), key=rank)
        return frac, losses[frac]


def ema_decay(t0: float, t1: float, frac: float) -> float:
    """tau for one update that moved the clock from t0 to t1 (0 when frac is 0: raw weights)."""
    if frac == 0 or t1 <= 0:
        return 0.0
    return 0.5 ** ((t1 - t0) / (frac * t1))


def ema_key(frac: float) -> str:
    """Stable name of an EMA in metrics and state dicts, e.g. 'ema/0.04'."""
    return f"ema/{frac:g}"


def fraction_label(frac: float) -> str:
    """An EMA fraction as tables show it: `raw` for the raw weights, blank when unknown."""
    if math.isnan(frac):
        return ""
    return "raw" if frac == 0 else f"{frac:g}"


def loss_key(frac: float) -> str:
    """The metric holding fraction `frac`'s validation loss: `val_loss_raw` for the raw
    weights, `val_loss_ema/<frac>` for an EMA."""
    return "val_loss_raw" if frac == 0 else f"val_loss_{ema_key(frac)}"


def averaged_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """What an EMA of `model` averages: its trainable parameters and floating-point buffers.

    Frozen parameters never move, so their average is themselves: they are left out. Float
    buffers (BatchNorm's running statistics) are averaged like weights, as timm's ModelEmaV3
    does, so EMA weights are evaluated with statistics of the same age; integer buffers
    (`num_batches_tracked`) are counters, not estimates, and stay raw.
    """
    trainable = [p for p in model.parameters() if p.requires_grad]
    return trainable + [b for b in model.buffers() if b.is_floating_point()]


def _average_dtype(tensor: torch.Tensor) -> torch.dtype:
    return torch.promote_types(tensor.dtype, torch.float32)


class EmaBank:
    """EMAs of `params` (any tensors: parameters, buffers) for each fraction; the raw
    weights stand in for frac = 0. Build it with `EmaBank.of(model, fractions)` to average
    what `averaged_tensors` says."""

    def __init__(self, params: Sequence[torch.Tensor], fractions: Sequence[float]) -> None:
        self.params = [p for p in params]
        self.fractions = [float(f) for f in fractions]  # 0: the raw weights
        self.averages: dict[float, list[torch.Tensor]] = {
            f: [p.detach().to(_average_dtype(p), copy=True) for p in self.params]
            for f in self.fractions
            if f > 0
        }
        self.t = 0.0

    @classmethod
    def of(cls, model: torch.nn.Module, fractions: Sequence[float]) -> EmaBank:
        """The bank of `averaged_tensors(model)`: of this rank's shards where the model is
        sharded (FSDP2), each rank averaging its own."""
        return cls(local_tensors(averaged_tensors(model)), fractions)

    @torch.no_grad()
    def update(self, t1: float) -> None:
        """Fold the current weights in after an update that brought the clock to t1."""
        t0, self.t = self.t, t1
        weights = [p.detach().to(_average_dtype(p)) for p in self.params]  # no copy in fp32
        for frac, average in self.averages.items():
            torch._foreach_lerp_(average, weights, 1.0 - ema_decay(t0, t1, frac))

    def weights(self, frac: float) -> list[torch.Tensor]:
        """EMA `frac`'s averages (float32 at least), or the raw weights for frac = 0."""
        return [p.detach() for p in self.params] if frac == 0 else self.averages[frac]

    @contextlib.contextmanager
    def swapped_in(self, frac: float) -> Iterator[None]:
        """Run the model with EMA `frac`'s weights in place; the raw weights come back after."""
        if frac == 0:
            yield
            return
        raw = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            torch._foreach_copy_([p.detach() for p in self.params], self.averages[frac])
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_([p.detach() for p in self.params], raw)

    def state_dict(self) -> dict:
        return {
            "t": self.t,
            "averages": {frac: [a.clone() for a in avg] for frac, avg in self.averages.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        if set(state["averages"]) != set(self.averages):
            raise ValueError(
                f"EMA fractions differ: checkpoint has {sorted(state['averages'])}, "
                f"this run has {sorted(self.averages)}"
            )
        self.t = float(state["t"])
        with torch.no_grad():
            for frac, average in self.averages.items():
                torch._foreach_copy_(average, list(state["averages"][frac]))
