"""LR grids that find their optimum: a reference is only an optimum if its best point is
interior, so a grid whose best LR sits at an edge is extended in that direction, by x2 steps,
up to a bound; where the bound is hit the result says so.

Pure functions of the losses seen so far, so a transfer that is killed and run again decides
the same extensions from the same finished runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["STEP", "GridState", "grid_state", "rank"]

#: Each extension multiplies (or divides) the grid's edge LR by this.
STEP = 2.0


@dataclass(frozen=True)
class GridState:
    """Where a grid stands: the best LR so far, the next LR to run (None when done), and
    whether the best is interior or stopped at an edge because the bound was hit."""

    best_lr: float | None
    next_lr: float | None
    interior: bool
    bound_hit: str | None  # "low" or "high" when the best is at an edge that may not move


def rank(loss: float) -> float:
    """A loss to compare: a diverged (non-finite) run ranks last."""
    return loss if math.isfinite(loss) else math.inf


def grid_state(
    start: Sequence[float], losses: Mapping[float, float], max_extensions: int
) -> GridState:
    """The state of a grid that started at the LRs `start` and has the `losses` (LR -> final
    loss; a diverged, non-finite run counts as the worst) of every run finished so far.

    A grid is extended while its best LR is its lowest (or highest) one, by one x2 step at a
    time, at most `max_extensions` times a side. Unfinished start points are run first."""
    missing = [lr for lr in start if lr not in losses]
    if missing:
        return GridState(None, missing[0], False, None)
    lrs = sorted(losses)
    best = min(lrs, key=lambda lr: (rank(losses[lr]), lr))
    low, high = min(start), max(start)
    for side, edge, beyond in (
        ("low", lrs[0], [lr for lr in lrs if lr < low]),
        ("high", lrs[-1], [lr for lr in lrs if lr > high]),
    ):
        if best != edge:
            continue
        if len(beyond) >= max_extensions:
            return GridState(best, None, False, side)
        return GridState(best, edge / STEP if side == "low" else edge * STEP, False, None)
    return GridState(best, None, True, None)
