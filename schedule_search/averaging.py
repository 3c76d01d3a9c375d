"""EMA bank: several horizon-free EMAs of the weights, updated on the token clock.

Each EMA has a half-life that is a fixed fraction of the run's age: after an update that moved
the clock from t0 to t1, `ema <- tau * ema + (1 - tau) * w` with
`tau = 0.5 ** ((t1 - t0) / (frac * t1))` (DESIGN section 2). Counting age on the clock, not in
updates, keeps uneven windows right (as EDM2 counts age in samples). frac = 0 is the raw
weights and costs nothing. One fused `torch._foreach_lerp_` per EMA per update.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Annotated

import torch
from pydantic import Field

from schedule_search.config import STRICT


@dataclass
class EmaConfig:
    """`fractions`: half-life / age for each EMA kept (0 = raw weights). `objective`: the
    fraction whose validation loss is the run's objective (must be one of `fractions`)."""

    __pydantic_config__ = STRICT

    fractions: list[Annotated[float, Field(ge=0, le=1)]] = field(
        default_factory=lambda: [0.0, 0.01, 0.04, 0.16]
    )
    objective: Annotated[float, Field(ge=0, le=1)] = 0.04

    def __post_init__(self) -> None:
        if len(set(self.fractions)) != len(self.fractions):
            raise ValueError(f"fractions: duplicates in {self.fractions}")
        if self.objective not in self.fractions:
            raise ValueError(
                f"objective: {self.objective} is not one of fractions {self.fractions}"
            )


def ema_decay(t0: float, t1: float, frac: float) -> float:
    """tau for one update that moved the clock from t0 to t1 (0 when frac is 0: raw weights)."""
    if frac == 0 or t1 <= 0:
        return 0.0
    return 0.5 ** ((t1 - t0) / (frac * t1))


def ema_key(frac: float) -> str:
    """Stable name of an EMA in metrics and state dicts, e.g. 'ema/0.04'."""
    return f"ema/{frac:g}"


class EmaBank:
    """EMAs of `params` for each fraction; the raw weights stand in for frac = 0."""

    def __init__(self, params: Sequence[torch.Tensor], fractions: Sequence[float]) -> None:
        self.params = [p for p in params]
        self.fractions = [float(f) for f in fractions]
        self.averages: dict[float, list[torch.Tensor]] = {
            f: [p.detach().clone() for p in self.params] for f in self.fractions if f > 0
        }
        self.clock = 0.0

    @torch.no_grad()
    def update(self, t1: float) -> None:
        """Fold the current weights in after an update that brought the clock to t1."""
        t0, self.clock = self.clock, t1
        weights = [p.detach() for p in self.params]
        for frac, average in self.averages.items():
            torch._foreach_lerp_(average, weights, 1.0 - ema_decay(t0, t1, frac))

    def weights(self, frac: float) -> list[torch.Tensor]:
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
            "clock": self.clock,
            "averages": {frac: [a.clone() for a in avg] for frac, avg in self.averages.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        if set(state["averages"]) != set(self.averages):
            raise ValueError(
                f"EMA fractions differ: checkpoint has {sorted(state['averages'])}, "
                f"this run has {sorted(self.averages)}"
            )
        self.clock = float(state["clock"])
        with torch.no_grad():
            for frac, average in self.averages.items():
                torch._foreach_copy_(average, list(state["averages"][frac]))
