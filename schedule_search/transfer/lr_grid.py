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

from schedule_search.transfer.scores import History, at_horizon, best_of_bank, last_iterate

__all__ = [
    "DEFAULT_SCORES",
    "GRID",
    "MAX_EXTENSIONS",
    "SCORES",
    "STEP",
    "GridSpec",
    "GridState",
    "canonical",
    "grid_state",
    "rank",
    "reach",
]

#: Each extension multiplies (or divides) the grid's edge LR by this.
STEP = 2.0
#: Initial LR grids, as factors of their centre (`transfer.plan.TransferStudy.centre`).
GRID = (0.5, 1.0, 2.0)
MAX_EXTENSIONS = 2  # per side; where the best is still at an edge the table marks it
#: How a grid's runs are scored, the first score picking its LR; its optimum must be interior
#: by each. The envelopes are reported at the last iterate and at their bank's best (two
#: envelopes); constant + EMA only by its bank's best (its raw weights are never its answer);
#: schedule-free's bank is its averaged weights alone, where the two scores agree.
SCORES: dict[str, tuple[str, ...]] = {"constant": ("ema",)}
DEFAULT_SCORES = ("last", "ema")


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


def reach(start: Sequence[float] = GRID) -> list[float]:
    """Every LR a grid that starts at `start` can run: its points and up to `MAX_EXTENSIONS`
    x`STEP` steps beyond either edge."""
    low, high = min(start), max(start)
    steps = [STEP**k for k in range(1, MAX_EXTENSIONS + 1)]
    return sorted({*start, *(low / step for step in steps), *(high * step for step in steps)})


def canonical(lr: float) -> float:
    """An LR as its run's name spells it (6 significant digits): names and grids agree."""
    return float(f"{lr:.6g}")


@dataclass(frozen=True)
class GridSpec:
    """One LR grid: a schedule kind at one horizon, and the LRs it starts from."""

    kind: str
    horizon: float
    start: tuple[float, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", tuple(canonical(lr) for lr in self.start))

    @property
    def prefix(self) -> str:
        """Run names: the grids picked once, at the sweep's horizon, carry no horizon."""
        if self.kind in ("schedulefree", "constant"):
            return f"{self.kind}-lr"
        return f"{self.kind}-{self.horizon:g}x-lr"

    @property
    def scores(self) -> tuple[str, ...]:
        return SCORES.get(self.kind, DEFAULT_SCORES)

    def run_name(self, lr: float) -> str:
        return f"{self.prefix}{canonical(lr):.6g}"

    def lr_of(self, name: str) -> float | None:
        if not name.startswith(self.prefix):
            return None
        try:
            return canonical(float(name.removeprefix(self.prefix)))
        except ValueError:
            return None

    def losses(self, finished: dict[str, History], score: str = "last") -> dict[float, float]:
        """LR -> loss at the grid's horizon of each finished run of the grid: its last
        iterate (`last`) or its bank's best member (`ema`); NaN where it did not get there."""
        out = {}
        for name, history in finished.items():
            lr = self.lr_of(name)
            if lr is None:
                continue
            row = at_horizon(history, self.horizon)
            if row is None:
                out[lr] = math.nan
            else:
                out[lr] = last_iterate(row) if score == "last" else best_of_bank(row)[0]
        return out

    def state(self, finished: dict[str, History], score: str | None = None) -> GridState:
        """The grid by `score`, by default the one that picks its LR."""
        losses = self.losses(finished, score or self.scores[0])
        return grid_state(self.start, losses, MAX_EXTENSIONS)

    def pick(self, finished: dict[str, History]) -> float | None:
        """The LR the grid picked: its best by its first score once it needs no more runs;
        None before, and where every run diverged (no run to continue or replicate)."""
        if self.to_run(finished):
            return None
        state = self.state(finished)
        if state.best_lr is None:
            return None
        loss = self.losses(finished, self.scores[0]).get(state.best_lr, math.nan)
        return state.best_lr if math.isfinite(loss) else None

    def to_run(self, finished: dict[str, History]) -> list[float]:
        """The LRs of this grid to run now: every unfinished start point, else the next
        extension by any of its scores (each needs an interior optimum)."""
        missing = [lr for lr in self.start if self.run_name(lr) not in finished]
        if missing:
            return missing
        steps = {self.state(finished, score).next_lr for score in self.scores}
        return sorted(canonical(lr) for lr in steps if lr is not None)
