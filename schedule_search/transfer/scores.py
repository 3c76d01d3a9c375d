"""How a transfer run is scored at a horizon: its last iterate, its EMA bank's best member, or
one member of the bank, read from its evaluations."""

from __future__ import annotations

import math

from schedule_search.train.evaluation import Evaluation

__all__ = ["History", "at_horizon", "best_of_bank", "last_iterate", "loss_at"]

History = list[Evaluation]


def at_horizon(history: History, horizon: float) -> Evaluation | None:
    """A run's evaluation at `horizon` (None when it did not get there)."""
    return next((row for row in history if math.isclose(row.chinchilla, horizon)), None)


def best_of_bank(row: Evaluation) -> tuple[float, float]:
    """(loss, fraction) of the best member of an evaluation's EMA bank (raw weights included)."""
    losses = {f: loss for f, loss in row.losses.items() if math.isfinite(loss)}
    if not losses:
        return math.nan, math.nan
    frac = min(losses, key=lambda f: (losses[f], f))
    return losses[frac], frac


def last_iterate(row: Evaluation) -> float:
    """The raw weights' loss (the objective where the raw weights were not evaluated)."""
    return row.losses.get(0.0, row.val_loss)


def loss_at(history: History, horizon: float, score: str | float) -> float:
    """A run's loss at `horizon`: its last iterate (`last`), its bank's best member (`ema`),
    or the member of EMA fraction `score`; NaN where it did not get there."""
    row = at_horizon(history, horizon)
    if row is None:
        return math.nan
    if score == "last":
        return last_iterate(row)
    if score == "ema":
        return best_of_bank(row)[0]
    return row.loss_at(float(score))
