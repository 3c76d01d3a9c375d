"""LR multipliers as pure functions of the clock t (reference steps); no torch needed.

The formulas here are the project's contract (tests/unit/core/test_schedules.py writes them
out again, independently). Peak LR times m(t) is the LR. Every schedule starts with the same
linear warmup from 0.1 to 1 over W reference steps. Only cosine, linear-to-zero and WSD know a
horizon T; constant and poly are horizon-free by construction: they have no field that could
hold one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from schedule_search.core.config import STRICT, Positive

__all__ = [
    "HORIZON_AWARE",
    "WARMUP_START",
    "Constant",
    "Cosine",
    "LinearToZero",
    "Poly",
    "ScheduleConfig",
    "Warmup",
    "Wsd",
]

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
class LinearToZero:
    """Linear decay to zero (D2Z; Bergsma et al. 2025): 1 - (t - W) / (T - W), exactly 0 at T
    and held there."""

    warmup: Warmup
    horizon: float

    def __call__(self, t: float) -> float:
        w = self.warmup.steps
        if t < w:
            return self.warmup(t)
        if t >= self.horizon:
            return 0.0
        return 1.0 - (t - w) / (self.horizon - w)


@dataclass(frozen=True)
class Wsd:
    """Warmup-stable-decay: constant until t0 = (1 - decay_fraction) * T (a branch off the
    constant run), then a cooldown over the last decay_fraction of T: `linear` from 1 to
    `floor`, or `sqrt`, 1 - sqrt((t - t0) / (T - t0)), exactly 0 at T (Hagele et al. 2024
    found it better than a linear cooldown; it ignores `floor`)."""

    warmup: Warmup
    horizon: float
    decay_fraction: float = 0.1
    floor: float = 0.1
    cooldown: Literal["linear", "sqrt"] = "linear"

    @property
    def branch_point(self) -> float:
        return (1.0 - self.decay_fraction) * self.horizon

    def __call__(self, t: float) -> float:
        if t < self.warmup.steps:
            return self.warmup(t)
        if t <= self.branch_point:
            return 1.0
        progress = min((t - self.branch_point) / (self.horizon - self.branch_point), 1.0)
        if self.cooldown == "sqrt":
            return 1.0 - math.sqrt(progress)
        return 1.0 - (1.0 - self.floor) * progress


Schedule = Constant | Poly | Cosine | LinearToZero | Wsd

#: The schedules that know their end T; only these need (and read) `horizon`.
HORIZON_AWARE = ("cosine", "linear", "wsd")

NonNegative = Annotated[float, Field(ge=0)]
#: A final multiplier: below peak, so a decaying schedule decays.
Floor = Annotated[float, Field(ge=0, lt=1)]


@dataclass
class ScheduleConfig:
    """A schedule in Chinchilla multiples (so a recipe carries over across model sizes).

    `warmup`, `alpha` and `horizon` are multiples of 1x Chinchilla; `build` converts them to
    reference steps once. `horizon` is only read by cosine, linear and wsd, and must be set for
    them.

    The defaults are the paper's proportions (Meterez et al. 2026): 1x Chinchilla = 12,500
    steps there, warmup W = 5,000 steps = 0.4x, and the selected offset alpha = 51,200 steps
    = 4.1x, rounded to 4x. With alpha = 4x the 1/sqrt multiplier is
    sqrt(4 / (t - 0.4 + 4)) = 0.73 at 4x and 0.34 at 32x (t in multiples); an alpha of a few
    hundredths of 1x would take it to 0.1 by 4x, which is not the paper's schedule.
    """

    __pydantic_config__ = STRICT

    #: constant and poly are horizon-free; cosine, linear (to zero) and wsd need `horizon`.
    kind: Literal["constant", "poly", "cosine", "linear", "wsd"] = "poly"
    #: Linear warmup from 0.1 to 1 of peak, in Chinchilla multiples (the paper's 0.4x).
    warmup: NonNegative = 0.4
    #: poly's exponent: 0 is constant, 0.5 the paper's 1/sqrt, 1 the 1/t decay.
    gamma: Annotated[float, Field(ge=0, le=2)] = 0.5
    #: poly's offset, in Chinchilla multiples (the paper's 4x): the decay's time scale.
    alpha: Positive = 4.0
    #: The end T of cosine, linear and wsd, in Chinchilla multiples.
    horizon: Positive | None = None
    #: cosine's and wsd's (linear cooldown) final multiplier (the paper's cosine: 10% of peak).
    floor: Floor = 0.1
    #: wsd: the share of T its cooldown takes.
    decay_fraction: Annotated[float, Field(gt=0, le=1)] = 0.1
    #: wsd: `linear` from 1 to `floor`, or `sqrt`: 1 - sqrt(progress), to exactly 0.
    cooldown: Literal["linear", "sqrt"] = "linear"

    def __post_init__(self) -> None:
        if self.kind in HORIZON_AWARE:
            if self.horizon is None:
                raise ValueError(f"horizon: required for a {self.kind} schedule")
            if self.horizon <= self.warmup:
                raise ValueError(f"horizon: must exceed warmup ({self.warmup}), got {self.horizon}")
        if self.kind == "wsd":
            assert self.horizon is not None
            start = (1.0 - self.decay_fraction) * self.horizon
            # No stable phase: the LR would drop at the warmup's end (a start at the warmup's
            # end, up to rounding, is the longest cooldown there is).
            if start < self.warmup and not math.isclose(start, self.warmup):
                # The largest fraction that fits, rounded down so that the value shown fits.
                most = math.floor((1.0 - self.warmup / self.horizon) * 1e6) / 1e6
                raise ValueError(
                    f"decay_fraction: {self.decay_fraction:g} of horizon {self.horizon:g} starts "
                    f"the cooldown at {start:g}, inside the warmup ({self.warmup:g}); expected "
                    f"at most {most:g}"
                )

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
        if self.kind == "linear":
            return LinearToZero(warmup, horizon)
        return Wsd(warmup, horizon, self.decay_fraction, self.floor, self.cooldown)
