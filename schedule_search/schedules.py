"""LR multipliers as pure functions of the clock t (reference steps); no torch needed.

The formulas are DESIGN section 2, the project's contract. Peak LR times m(t) is the LR. Every
schedule starts with the same linear warmup from 0.1 to 1 over W reference steps. Only cosine
and WSD know a horizon T; constant and poly are horizon-free by construction: they have no
field that could hold one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from schedule_search.config import STRICT

WARMUP_START = 0.1


@dataclass(frozen=True)
class Warmup:
    """Linear warmup: m = 0.1 + 0.9 * min(t, W) / W. W = 0 means no warmup."""

    steps: float

    def __call__(self, t: float) -> float:
        if self.steps <= 0 or t >= self.steps:
            return 1.0
        return WARMUP_START + (1.0 - WARMUP_START) * max(t, 0.0) / self.steps


@dataclass(frozen=True)
class Constant:
    warmup: Warmup

    def __call__(self, t: float) -> float:
        return self.warmup(t)


@dataclass(frozen=True)
class Poly:
    """(alpha / (t - W + alpha)) ** gamma after warmup; gamma = 0.5 is the shifted 1/sqrt(t)."""

    warmup: Warmup
    gamma: float
    alpha: float

    def __call__(self, t: float) -> float:
        if t < self.warmup.steps:
            return self.warmup(t)
        return (self.alpha / (t - self.warmup.steps + self.alpha)) ** self.gamma


@dataclass(frozen=True)
class Cosine:
    """floor + (1 - floor) * (1 + cos(pi * (t - W) / (T - W))) / 2, held at floor after T."""

    warmup: Warmup
    horizon: float
    floor: float = 0.1

    def __call__(self, t: float) -> float:
        w = self.warmup.steps
        if t < w:
            return self.warmup(t)
        progress = min((t - w) / (self.horizon - w), 1.0)
        return self.floor + (1.0 - self.floor) * (1.0 + math.cos(math.pi * progress)) / 2.0


@dataclass(frozen=True)
class Wsd:
    """Warmup-stable-decay: constant, then linear from 1 to floor over the last
    decay_fraction of T (a branch off the constant run at (1 - decay_fraction) * T)."""

    warmup: Warmup
    horizon: float
    decay_fraction: float = 0.1
    floor: float = 0.1

    @property
    def branch_point(self) -> float:
        return (1.0 - self.decay_fraction) * self.horizon

    def __call__(self, t: float) -> float:
        if t < self.warmup.steps:
            return self.warmup(t)
        if t <= self.branch_point:
            return 1.0
        progress = min((t - self.branch_point) / (self.decay_fraction * self.horizon), 1.0)
        return 1.0 - (1.0 - self.floor) * progress


Schedule = Constant | Poly | Cosine | Wsd

Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, lt=1)]


@dataclass
class ScheduleConfig:
    """A schedule in Chinchilla multiples (so a recipe carries over across model sizes).

    `warmup`, `alpha` and `horizon` are multiples of 1x Chinchilla; `build` converts them to
    reference steps once. `horizon` is only read by cosine and wsd, and must be set for them.
    """

    __pydantic_config__ = STRICT

    kind: Literal["constant", "poly", "cosine", "wsd"] = "poly"
    warmup: NonNegative = 0.05
    gamma: Annotated[float, Field(ge=0, le=2)] = 0.5
    alpha: Positive = 0.05
    horizon: Positive | None = None
    floor: Fraction = 0.1
    decay_fraction: Annotated[float, Field(gt=0, le=1)] = 0.1

    def __post_init__(self) -> None:
        if self.kind in ("cosine", "wsd"):
            if self.horizon is None:
                raise ValueError(f"horizon: required for a {self.kind} schedule")
            if self.horizon <= self.warmup:
                raise ValueError(f"horizon: must exceed warmup ({self.warmup}), got {self.horizon}")

    def build(self, steps_per_chinchilla: float) -> Schedule:
        warmup = Warmup(self.warmup * steps_per_chinchilla)
        if self.kind == "constant":
            return Constant(warmup)
        if self.kind == "poly":
            return Poly(warmup, self.gamma, self.alpha * steps_per_chinchilla)
        assert self.horizon is not None  # checked in __post_init__
        horizon = self.horizon * steps_per_chinchilla
        if self.kind == "cosine":
            return Cosine(warmup, horizon, self.floor)
        return Wsd(warmup, horizon, self.decay_fraction, self.floor)
