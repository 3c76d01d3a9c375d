"""A schedule-aware loss law, fitted on a sweep's curves, that predicts a run's loss past them.

The law (after Tissue et al. 2024, "Scaling Law with Learning Rate Annealing", arXiv
2408.11029, generalized so that runs of different peak LRs and batches share one law):

    L(t) = L0 + A * S(t) ** -alpha + D * lr_smooth(t) * microbatches ** -nu
    S(t) = integral over u < t of lr(u) ** p du * microbatches ** -q

- `S(t)`: the progress made. Tissue's forward area S1 (the LR summed over steps) is p = q = 1.
  On our curves it is not the progress: on the 45 AdamW runs of
  bench/results/family-search/grid.jsonl (0.5x-4x, LRs 1.5e-3 to 2.4e-2) p = q = 1 leaves
  residuals of 0.072 nats RMS (a run at 8x the LR does not get anywhere near 8x sooner to a
  loss); with p and q fitted (0.42 and 0.89 there) 0.023.
- `lr_smooth(t)`: the LR seen through an exponential memory of `tau` Chinchilla multiples
  (d lr_smooth/dt = (lr - lr_smooth) / tau). Tissue's annealing area S2, with its momentum,
  is this same memory of the LR's decrease; written as a floor proportional to the remembered
  LR it also says that a constant LR too high for a horizon ends higher, which lets one law
  choose each horizon's best LR. `microbatches ** -nu`: a bigger batch has less gradient noise.

t is the run's age in Chinchilla multiples; a horizon-free schedule (constant, poly,
schedule-free) is a function of t alone, so its forecast needs no horizon.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np
from scipy.optimize import least_squares
from scipy.signal import lfilter

from schedule_search.core.schedules import ScheduleConfig

__all__ = ["Curve", "LossLaw", "Run", "fit_law"]

#: Integration step of the LR in Chinchilla multiples (32x is 6,400 steps of it).
STEP = 0.005


@dataclass(frozen=True)
class Run:
    """What the law needs of a run: its peak LR, schedule and micro-batches per step."""

    lr: float
    schedule: ScheduleConfig
    microbatches: int = 1

    def lr_on_grid(self, end: float) -> tuple[np.ndarray, np.ndarray]:
        """The integration grid up to `end` and the LR on it."""
        shape = tuple(sorted(asdict(self.schedule).items()))
        grid, multiplier = _multiplier(shape, math.ceil(end / STEP))
        return grid, self.lr * multiplier


@lru_cache(maxsize=512)
def _multiplier(shape: tuple, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """The multiplier of the schedule whose fields are `shape` on the first `steps` points of
    the grid (computed once for every LR of a grid and every refit of the bootstrap)."""
    grid = np.arange(1, steps + 1) * STEP
    multiplier = ScheduleConfig(**dict(shape)).build(1.0)  # reference steps = Chinchilla x
    return grid, np.array([multiplier(float(t)) for t in grid])


@dataclass(frozen=True)
class Curve:
    """A run and the losses it measured: `points` maps t (Chinchilla multiples) to loss."""

    run: Run
    points: dict[float, float]


@dataclass(frozen=True)
class _Features:
    """A run's LR on the integration grid (steps of STEP from STEP) up to some age."""

    run: Run
    grid: np.ndarray
    lr: np.ndarray

    @classmethod
    def up_to(cls, run: Run, end: float) -> _Features:
        return cls(run, *run.lr_on_grid(end))

    def smoothed_lr(self, tau: float) -> np.ndarray:
        keep = math.exp(-STEP / tau)
        start = [keep * self.lr[0]]
        return lfilter([1.0 - keep], [1.0, -keep], self.lr, zi=start)[0]

    def progress(self, at: np.ndarray, p: float, q: float) -> np.ndarray:
        area = np.cumsum(self.lr**p) * STEP * self.run.microbatches ** (-q)
        return np.interp(at, self.grid, area)

    def remembered_lr(self, at: np.ndarray, tau: float) -> np.ndarray:
        return np.interp(at, self.grid, self.smoothed_lr(tau))


@dataclass(frozen=True)
class LossLaw:
    """The fitted law; `predict` evaluates it for any run at any age."""

    l0: float
    a: float
    alpha: float
    d: float
    nu: float
    tau: float
    p: float
    q: float
    rmse: float = math.nan

    @classmethod
    def from_vector(cls, theta: Sequence[float], rmse: float = math.nan) -> LossLaw:
        l0, log_a, alpha, log_d, nu, log_tau, p, q = (float(x) for x in theta)
        a, d, tau = math.exp(log_a), math.exp(log_d), math.exp(log_tau)
        return cls(l0, a, alpha, d, nu, tau, p, q, rmse)

    def vector(self) -> np.ndarray:
        logs = (math.log(self.a), math.log(self.d), math.log(self.tau))
        return np.array([self.l0, logs[0], self.alpha, logs[1], self.nu, logs[2], self.p, self.q])

    def predict(self, run: Run, at: Sequence[float]) -> np.ndarray:
        times = np.asarray(at, dtype=float)
        return _evaluate(self.vector(), _Features.up_to(run, float(times.max())), times)


def _evaluate(theta: np.ndarray, features: _Features, at: np.ndarray) -> np.ndarray:
    l0, log_a, alpha, log_d, nu, log_tau, p, q = theta
    progress = np.maximum(features.progress(at, p, q), 1e-12)
    noise = math.exp(log_d) * features.remembered_lr(at, math.exp(log_tau))
    return l0 + math.exp(log_a) * progress ** (-alpha) + noise * features.run.microbatches ** (-nu)


#: Starting points of the fit (alpha, log tau, p); the best end is kept.
_STARTS = ((0.5, math.log(0.2), 0.5), (1.0, 0.0, 1.0), (0.3, math.log(0.05), 0.2), (2.0, 0.0, 0.5))
#: Bounds of (L0 is bounded above by the lowest loss seen) log A, alpha, log D, nu, log tau,
#: p, q.
_LOWER = [-20.0, 0.02, -20.0, 0.0, math.log(0.005), 0.0, 0.0]
_UPPER = [20.0, 4.0, 20.0, 1.5, math.log(20.0), 1.5, 1.5]


def fit_law(curves: Sequence[Curve], start: LossLaw | None = None) -> LossLaw:
    """Least squares over every curve's points at once (one law for all of them); from
    `start` alone when given (a bootstrap refit), else from a few starting points."""
    prepared = [(_Features.up_to(c.run, max(c.points)), np.array(sorted(c.points))) for c in curves]
    observed = np.concatenate([[c.points[t] for t in sorted(c.points)] for c in curves])

    def residuals(theta: np.ndarray) -> np.ndarray:
        predicted = [_evaluate(theta, features, at) for features, at in prepared]
        return np.concatenate(predicted) - observed

    floor = float(observed.min())
    lower, upper = [0.0, *_LOWER], [floor, *_UPPER]
    if start is not None:
        starts = [np.clip(start.vector(), lower, upper)]
    else:
        starts = [
            np.array([0.8 * floor, 0.0, alpha, 0.0, 0.5, log_tau, p, 1.0])
            for alpha, log_tau, p in _STARTS
        ]
    best = None
    for theta in starts:
        fitted = least_squares(residuals, theta, bounds=(lower, upper), x_scale="jac")
        if best is None or fitted.cost < best.cost:
            best = fitted
    assert best is not None
    rmse = float(np.sqrt(np.mean(best.fun**2)))
    return LossLaw.from_vector(best.x, rmse)


def with_schedule(run: Run, **changes: Any) -> Run:
    """`run` with its schedule's fields changed (a horizon, another kind)."""
    return replace(run, schedule=replace(run.schedule, **changes))
