"""What a transfer study runs: the recipe at longer horizons, and the references a skeptic
would pick instead, each tuned the way it would be in practice.

- recipe: one anytime run to the largest horizon, continued from the sweep trial's checkpoint
  at the sweep's horizon when config and tokens per step match (else trained from token 0);
  scored with the recipe's own EMA fraction.
- constant: constant LR + the EMA bank at the recipe's LR, to the largest horizon; the trunk
  the WSD runs branch from.
- wsd: branches off the constant run, decaying linearly to 10% over the last 10% of each
  horizon; wsd-sqrt: decaying as 1 - sqrt to exactly 0 over the last 20% (Hagele et al. 2024).
- schedulefree: schedule-free AdamW (Defazio et al. 2024), its LR picked at the sweep's
  horizon on a grid centred where its authors say to start (`SCHEDULE_FREE_LR`), the winner
  continued to the largest horizon; evaluated at its averaged weights. Where the recipe is
  schedule-free AdamW itself, the recipe is this row (not run twice), and the AdamW references
  below start from its LR over `SCHEDULE_FREE_LR`.
- cosine (to 10% of peak, the paper's baseline) and linear (decay to zero, Bergsma et al.
  2025): one run per horizon per LR, on grids extended at whichever edge holds the best point
  until it is interior (`lr_grid`); the best of each is an envelope. Compute goes where it
  decides the envelope: both kinds' grids at the first horizon are centred on the recipe's LR
  and at each later horizon on the LR best for both together at the horizon before
  (`TransferStudy.centre`). A horizon's grids start once those before have settled.

The study is a function of finished results: `pending(finished)` says which runs can start
now, so the runner goes round by round and a killed transfer decides the same rounds again.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedule_search.core.averaging import DEFAULT_FRACTIONS
from schedule_search.core.config import parse, to_dict
from schedule_search.core.optimizer import SCHEDULE_FREE_LR, OptimizerConfig
from schedule_search.train.config import TrainConfig
from schedule_search.train.evaluation import Evaluation
from schedule_search.transfer.lr_grid import GridState, grid_state, rank

__all__ = [
    "ENVELOPE",
    "FLOOR",
    "GRID",
    "MAX_EXTENSIONS",
    "METHODS",
    "SCHEDULE_FREE_LR",
    "WSD",
    "GridSpec",
    "TransferStudy",
    "at_horizon",
    "best_of_bank",
    "canonical",
    "last_iterate",
    "loss_at",
]

METHODS = ("recipe", "constant", "schedulefree", "cosine", "linear", "wsd")
#: The horizon-aware schedules tuned per horizon; their best is the envelope.
ENVELOPE = ("cosine", "linear")
#: Initial LR grids, as factors of their centre (`TransferStudy.centre`; schedule-free's is
#: `SCHEDULE_FREE_LR` times the recipe's LR); every grid is extended by x2 steps at an edge.
GRID = (0.5, 1.0, 2.0)
MAX_EXTENSIONS = 2  # per side; where the best is still at an edge the table marks it
FLOOR = 0.1
#: WSD branches: name prefix -> (share of the horizon the cooldown takes, cooldown, floor).
WSD = {"wsd": (0.1, "linear", FLOOR), "wsd-sqrt": (0.2, "sqrt", 0.0)}

History = list[Evaluation]
#: (run name, tokens) -> the checkpoint folder of that finished run at or after those tokens.
CheckpointAt = Callable[[str, float], Path]


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


@dataclass
class TransferStudy:
    """The runs of a transfer of the recipe config `base` to `horizons` (Chinchilla
    multiples, the sweep's own among them)."""

    base: TrainConfig
    horizons: list[float]
    methods: list[str]
    sweep_horizon: float
    #: The sweep trial's checkpoint at its horizon, where the recipe run may continue from.
    continue_from: str | None = None
    continued_trial: str | None = None
    tree: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.horizons = sorted(self.horizons)
        self.tree = to_dict(self.base)
        self.tree["branch_from"] = None
        if self.schedule_free_recipe:
            self.methods = [m for m in self.methods if m != "schedulefree"]

    @property
    def schedule_free_recipe(self) -> bool:
        return self.base.optimizer.name == "schedulefree_adamw"

    @property
    def adamw_lr(self) -> float:
        """The AdamW LR the references start from: the recipe's, or a schedule-free recipe's
        over `SCHEDULE_FREE_LR` (its README's 1x-10x, read backwards from the middle)."""
        lr = self.base.optimizer.lr
        return lr / SCHEDULE_FREE_LR if self.schedule_free_recipe else lr

    @property
    def top(self) -> float:
        return max(self.horizons)

    @property
    def recipe_fraction(self) -> float:
        return float(self.base.ema.objective)  # transfer_base set the exported fraction

    # -- run configs ------------------------------------------------------------------------
    def _variant(self, **changes: Any) -> dict[str, Any]:
        """The recipe's config with sections changed; a reference's (every run but the recipe
        and schedule-free's) trains with AdamW at its own betas, never a schedule-free recipe's
        optimizer."""
        run = copy.deepcopy(self.tree)
        if self.schedule_free_recipe and "optimizer" in changes:
            run["optimizer"] = to_dict(OptimizerConfig(lr=self.adamw_lr))
        for section, values in changes.items():
            if isinstance(values, dict) and isinstance(run.get(section), dict):
                run[section].update(values)
            else:
                run[section] = values
        return run

    def _milestones(self, up_to: float, extra: tuple[float, ...] = ()) -> list[float]:
        points, m = set(extra), 0.25
        while m < up_to:
            points.add(m)
            m *= 2
        points |= {h for h in self.horizons if h < up_to}
        return sorted(p for p in points if p < up_to)

    def _bank(self) -> dict[str, Any]:
        """Every reference keeps the EMA bank, scored at its last iterate (objective 0)."""
        fractions = sorted(set(self.tree["ema"]["fractions"]) | set(DEFAULT_FRACTIONS))
        return {"fractions": fractions, "objective": 0.0}

    def recipe(self) -> dict[str, Any]:
        return self._variant(
            budget={"horizon": self.top, "eval_at": self._milestones(self.top)},
            branch_from=self.continue_from,
        )

    def constant(self) -> dict[str, Any]:
        branch_points = tuple(
            (1 - share) * h for h in self.horizons for share, _, _ in WSD.values()
        )
        return self._variant(
            optimizer={"lr": self.adamw_lr},
            schedule={"kind": "constant"},
            ema=self._bank(),
            budget={"horizon": self.top, "eval_at": self._milestones(self.top, branch_points)},
            checkpoint={"keep": 10_000, "every_windows": 0},  # the WSD branch points stay
        )

    def horizon_aware(self, kind: str, horizon: float, lr: float) -> dict[str, Any]:
        schedule: dict[str, Any] = {"kind": kind, "horizon": horizon}
        if kind == "cosine":
            schedule["floor"] = FLOOR
        return self._variant(
            schedule=schedule,
            optimizer={"lr": lr},
            ema=self._bank(),
            budget={"horizon": horizon, "eval_at": self._milestones(horizon)},
        )

    def schedulefree(self, lr: float, horizon: float, branch_from: str | None) -> dict[str, Any]:
        return self._variant(
            optimizer={"name": "schedulefree_adamw", "lr": lr},
            schedule={"kind": "constant"},
            ema={"fractions": [0.0], "objective": 0.0},  # its average lives in the optimizer
            budget={"horizon": horizon, "eval_at": self._milestones(horizon)},
            branch_from=branch_from,
        )

    def wsd(self, prefix: str, horizon: float, trunk: Path) -> dict[str, Any]:
        share, cooldown, floor = WSD[prefix]
        run = copy.deepcopy(self.constant())
        run["schedule"].update(
            kind="wsd", horizon=horizon, decay_fraction=share, floor=floor, cooldown=cooldown
        )
        run["budget"].update(horizon=horizon, eval_at=[])
        run["checkpoint"] = {"keep": 2, "every_windows": 0}
        run["branch_from"] = str(trunk)
        return run

    def span(self, config: dict[str, Any]) -> tuple[float, float]:
        """The Chinchilla multiples a planned run trains over: a branch or continuation starts
        where its checkpoint is."""
        end = config["budget"]["horizon"]
        if config.get("branch_from") is None:
            return 0.0, end
        schedule = config["schedule"]
        if schedule["kind"] == "wsd":
            return (1 - schedule["decay_fraction"]) * end, end
        return self.sweep_horizon, end

    def length(self, config: dict[str, Any]) -> float:
        """The Chinchilla multiples a planned run trains (its compute)."""
        start, end = self.span(config)
        return end - start

    # -- grids ------------------------------------------------------------------------------
    @property
    def envelope_kinds(self) -> list[str]:
        """The horizon-aware schedules whose per-horizon grids make the envelope."""
        return [kind for kind in ENVELOPE if kind in self.methods]

    def grid(self, kind: str, horizon: float, finished: dict[str, History]) -> GridSpec | None:
        """The LR grid of `kind` (cosine, linear, schedulefree) at `horizon`, or None while the
        grids it is centred on have not settled (`centre`)."""
        if kind == "schedulefree":
            return self.schedulefree_grid()
        centre = self.centre(horizon, finished)
        if centre is None:
            return None
        return GridSpec(kind, horizon, tuple(centre * f for f in GRID))

    def centre(self, horizon: float, finished: dict[str, History]) -> float | None:
        """The LR the envelope's grids at `horizon` are centred on: at the first horizon the
        recipe's; at every later one the LR with the lowest last-iterate loss summed over the
        kinds, among those every kind ran at the horizon before. The optimum moves little from
        one doubling to the next, so the long grids, which cost most, rarely need extending;
        two curves that share peak LR and warmup pick it with less noise than either alone
        where the loss is flat near its optimum. Both kinds' grids of a horizon start together:
        runs of equal length fill a round's parallel slots. None until the grids of the
        horizon before have all settled."""
        shorter = [h for h in self.horizons if h < horizon]
        if not shorter:
            return self.adamw_lr
        before = self.centre(shorter[-1], finished)
        if before is None:
            return None
        start = tuple(before * f for f in GRID)
        anchors = [GridSpec(kind, shorter[-1], start) for kind in self.envelope_kinds]
        if not anchors or any(a.to_run(finished) for a in anchors):
            return None
        losses = [a.losses(finished) for a in anchors]
        shared = set.intersection(*(set(by_lr) for by_lr in losses))
        return min(shared, key=lambda lr: (sum(rank(by_lr[lr]) for by_lr in losses), lr))

    def grids(self, finished: dict[str, History]) -> list[GridSpec]:
        out = []
        for kind in self.envelope_kinds:
            out += [g for h in self.horizons if (g := self.grid(kind, h, finished))]
        if "schedulefree" in self.methods:
            out.append(self.schedulefree_grid())
        return out

    def schedulefree_grid(self) -> GridSpec:
        """Schedule-free AdamW's LR is picked at the sweep's horizon, like the recipe's."""
        centre = SCHEDULE_FREE_LR * self.adamw_lr
        return GridSpec("schedulefree", self.sweep_horizon, tuple(centre * f for f in GRID))

    # -- what can run now -------------------------------------------------------------------
    def pending(
        self,
        finished: dict[str, History],
        checkpoint_at: CheckpointAt,
        ended: frozenset[str] = frozenset(),
    ) -> dict:
        """name -> config of every run that can start now and has not finished.

        `finished` holds the earlier rounds (what decides this round); `ended` names runs that
        already ended in this round, replayed on resume: they are not pending either."""
        done = finished.keys() | ended
        runs: dict[str, dict[str, Any]] = {}
        if "recipe" in self.methods:
            runs["recipe"] = self.recipe()
        if "constant" in self.methods or "wsd" in self.methods:
            runs["constant"] = self.constant()
        for spec in self.grids(finished):
            for lr in spec.to_run(finished):
                runs[spec.run_name(lr)] = spec.config(self, lr)
        # Branches and continuations look their checkpoint up only while they are to run: an
        # ended one needs nothing of its trunk (whose checkpoints may be pruned since).
        if "wsd" in self.methods and "constant" in finished:
            for prefix, (share, _, _) in WSD.items():
                for h in self.horizons:
                    if (name := f"{prefix}-{h:g}x") not in done:
                        trunk = checkpoint_at("constant", (1 - share) * h)
                        runs[name] = self.wsd(prefix, h, trunk)
        if "schedulefree" in self.methods and "schedulefree" not in done:
            spec = self.schedulefree_grid()
            best = spec.state(finished).best_lr
            if not spec.to_run(finished) and best is not None and self.top > spec.horizon:
                start = checkpoint_at(spec.run_name(best), spec.horizon)
                runs["schedulefree"] = self.schedulefree(best, self.top, str(start))
        for name, config in runs.items():  # validated here, not inside a trial
            parse(TrainConfig, config, f"transfer run {name}")
        return {name: config for name, config in runs.items() if name not in done}


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
        if self.kind == "schedulefree":
            return "schedulefree-lr"
        return f"{self.kind}-{self.horizon:g}x-lr"

    def run_name(self, lr: float) -> str:
        return f"{self.prefix}{canonical(lr):.6g}"

    def lr_of(self, name: str) -> float | None:
        if not name.startswith(self.prefix):
            return None
        try:
            return canonical(float(name.removeprefix(self.prefix)))
        except ValueError:
            return None

    def config(self, study: TransferStudy, lr: float) -> dict[str, Any]:
        if self.kind == "schedulefree":
            return study.schedulefree(lr, self.horizon, None)
        return study.horizon_aware(self.kind, self.horizon, lr)

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

    def state(self, finished: dict[str, History], score: str = "last") -> GridState:
        return grid_state(self.start, self.losses(finished, score), MAX_EXTENSIONS)

    def to_run(self, finished: dict[str, History]) -> list[float]:
        """The LRs of this grid to run now: every unfinished start point, else the next
        extension by either scoring (the last iterate's envelope and the best EMA's both need
        an interior optimum)."""
        missing = [lr for lr in self.start if self.run_name(lr) not in finished]
        if missing:
            return missing
        steps = {s.next_lr for s in (self.state(finished), self.state(finished, "ema"))}
        return sorted(canonical(lr) for lr in steps if lr is not None)
