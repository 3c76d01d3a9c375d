"""A horizon-free run continued: its own curve, L(t) = E + A * t ** -alpha, fitted on the
evaluations it made after its warmup and read at longer horizons.

A horizon-free run (a constant LR, the poly decay, schedule-free AdamW) trained to 32x is the
run the sweep trained to 4x, trained on: nothing about it changes at 4x, so its loss past 4x
is the continuation of the curve it already measured. A power law in the data seen with an
irreducible floor is the usual form of such a curve (Hoffmann et al.'s data term). The
cross-trial law (`forecast.law`) cannot stand in for it where its form misses the optimizer:
on the committed study it forecast the schedule-free recipe 0.08-0.23 nats too low at
8x-32x, while this curve, fitted on the same run's 0.5x-4x, missed by +0.0009, +0.0005 and
+0.0021 (`python bench/forecast.py`, which also reports it on every horizon-free run of the
study, where it is less close).

The interval is the lowest and highest forecast of the curve refitted without each one of its
evaluations in turn: how much the forecast rests on any single measurement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

__all__ = ["MIN_OWN_POINTS", "PowerCurve", "continue_curve", "fit_power_curve", "past_warmup"]

#: Evaluations past the warmup a curve needs: three parameters and one evaluation to spare
#: (a default sweep's trial that reached 4x has at least four, 1x to 4x, past a warmup under 1x).
MIN_OWN_POINTS = 4


@dataclass(frozen=True)
class PowerCurve:
    """L(t) = floor + scale * t ** -exponent, t in Chinchilla multiples."""

    floor: float
    scale: float
    exponent: float

    def predict(self, at: Sequence[float]) -> np.ndarray:
        return self.floor + self.scale * np.asarray(at, dtype=float) ** -self.exponent


def fit_power_curve(points: Mapping[float, float]) -> PowerCurve:
    """Least squares on `points` (t -> loss); the floor is kept at or above 0 and below the
    lowest loss measured, the exponent in (0.05, 3)."""
    ages = np.array(sorted(points), dtype=float)
    losses = np.array([points[t] for t in ages])
    lowest = float(losses.min())

    def residuals(theta: np.ndarray) -> np.ndarray:
        return theta[0] + theta[1] * ages ** -theta[2] - losses

    start = np.array([0.9 * lowest, max(float(losses[0]) - 0.9 * lowest, 1e-3), 0.7])
    fitted = least_squares(
        residuals, start, bounds=([0.0, 0.0, 0.05], [lowest, np.inf, 3.0]), x_scale="jac"
    )
    floor, scale, exponent = (float(x) for x in fitted.x)
    return PowerCurve(floor, scale, exponent)


def past_warmup(points: Mapping[float, float], warmup: float) -> dict[float, float]:
    """The finite evaluations made after the warmup: during it the LR still rises, and the
    curve there follows the warmup, not the run."""
    return {t: loss for t, loss in points.items() if t > warmup and np.isfinite(loss)}


def continue_curve(points: Mapping[float, float], horizon: float) -> tuple[float, float, float]:
    """(forecast, low, high) of the run whose evaluations are `points` at `horizon`: the
    curve on every point, and the range of its refits without each point in turn."""
    if len(points) < MIN_OWN_POINTS:
        raise ValueError(f"{len(points)} evaluations; a curve needs {MIN_OWN_POINTS}")
    forecast = float(fit_power_curve(points).predict([horizon])[0])
    refits = [
        float(fit_power_curve({t: v for t, v in points.items() if t != left}).predict([horizon])[0])
        for left in points
    ]
    return forecast, min(forecast, *refits), max(forecast, *refits)
