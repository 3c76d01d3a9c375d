"""What a transfer study runs: the recipe at longer horizons, and the references a skeptic
would pick instead, each tuned the way it would be in practice.

- recipe: one anytime run to the largest horizon, continued from the sweep trial's checkpoint
  at the sweep's horizon when config and tokens per step match (else trained from token 0);
  scored with the recipe's own EMA fraction.
- constant: AdamW at a constant LR with the EMA bank, scored by the bank's best; the trunk the
  WSD runs branch from. Its LR is picked at the sweep's horizon on a grid centred on the
  recipe's AdamW LR, scored like its row (the bank's best), and the winner continued to the
  largest horizon (`CONSTANT_LR` "tuned"). Transfers launched before that rule ran it at the
  recipe's AdamW LR itself ("recipe"), a reference at an LR no one tuned: for a
  schedule-free recipe 1.19e-2, twice the 5.9e-3 AdamW's envelopes pick at 4x.
- wsd: branches off the constant trunk, decaying linearly to 10% over the last 10% of each
  horizon; wsd-sqrt: decaying as 1 - sqrt to exactly 0 over the last 20% (Hagele et al. 2024).
- schedulefree: schedule-free AdamW (Defazio et al. 2024), its LR picked at the sweep's
  horizon on a grid centred where its authors say to start (`SCHEDULE_FREE_LR`), the winner
  continued to the largest horizon; evaluated at its averaged weights. Where the recipe is
  schedule-free AdamW itself, the recipe is this row (not run twice), and the AdamW references
  start from its LR over `SCHEDULE_FREE_LR`.
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
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedule_search.core.averaging import DEFAULT_FRACTIONS
from schedule_search.core.config import ConfigError, parse, to_dict
from schedule_search.core.optimizer import SCHEDULE_FREE_LR, OptimizerConfig
from schedule_search.train.config import TrainConfig
from schedule_search.transfer.lr_grid import GRID, GridSpec, rank
from schedule_search.transfer.scores import History

__all__ = [
    "CONSTANT_LR",
    "ENVELOPE",
    "FLOOR",
    "METHODS",
    "SCHEDULE_FREE_LR",
    "WSD",
    "CheckpointAt",
    "TransferStudy",
    "constant_lr_of",
]

METHODS = ("recipe", "constant", "schedulefree", "cosine", "linear", "wsd")
#: The horizon-aware schedules tuned per horizon; their best is the envelope.
ENVELOPE = ("cosine", "linear")
#: The rules for the constant trunk's LR (the module's docstring); the first is the one new
#: launches take.
CONSTANT_LR = ("tuned", "recipe")
FLOOR = 0.1
#: WSD branches: name prefix -> (share of the horizon the cooldown takes, cooldown, floor).
WSD = {"wsd": (0.1, "linear", FLOOR), "wsd-sqrt": (0.2, "sqrt", 0.0)}


def constant_lr_of(launched: Path) -> str:
    """The rule for constant + EMA's LR of the transfer whose `launch.json` is `launched`: the
    one it was launched with (one launched before the rule was recorded ran the recipe's
    AdamW LR, and goes on so), or, where there is none yet, the one a new launch takes."""
    if not launched.exists():
        return CONSTANT_LR[0]
    rule = json.loads(launched.read_text()).get("constant_lr", "recipe")
    if rule not in CONSTANT_LR:
        raise ConfigError(
            f"{launched}: constant_lr: expected one of {', '.join(CONSTANT_LR)}, got {rule!r}"
        )
    return str(rule)


#: (run name, tokens) -> the checkpoint folder of that finished run at or after those tokens.
CheckpointAt = Callable[[str, float], Path]


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
    #: How the constant trunk's LR is chosen (`CONSTANT_LR`).
    constant_lr: str = CONSTANT_LR[0]
    tree: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        if self.constant_lr not in CONSTANT_LR:
            raise ConfigError(
                f"constant_lr: expected one of {', '.join(CONSTANT_LR)}, got {self.constant_lr!r}"
            )
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

    @property
    def has_trunk(self) -> bool:
        return "constant" in self.methods or "wsd" in self.methods

    def trunk(self, lr: float, horizon: float, branch_from: str | None = None) -> dict[str, Any]:
        """Constant LR + the EMA bank to `horizon`, evaluated and checkpointed where the WSD
        branches start."""
        branch_points = tuple(
            (1 - share) * h for h in self.horizons for share, _, _ in WSD.values()
        )
        return self._variant(
            optimizer={"lr": lr},
            schedule={"kind": "constant"},
            ema=self._bank(),
            budget={"horizon": horizon, "eval_at": self._milestones(horizon, branch_points)},
            checkpoint={"keep": 10_000, "every_windows": 0},  # the WSD branch points stay
            branch_from=branch_from,
        )

    def constant_grid(self) -> GridSpec:
        """The constant trunk's LR grid at the sweep's horizon, centred on the recipe's AdamW
        LR (rule "tuned")."""
        return GridSpec("constant", self.sweep_horizon, tuple(self.adamw_lr * f for f in GRID))

    def trunk_lr(self, finished: dict[str, History]) -> float | None:
        """The constant trunk's LR: the recipe's AdamW LR (rule "recipe"), or its grid's pick
        by the bank's best once the grid has settled (None before)."""
        if self.constant_lr == "recipe":
            return self.adamw_lr
        return self.constant_grid().pick(finished)

    def trunk_run(self, point: float, finished: dict[str, History]) -> str | None:
        """The seed-0 run a WSD branch at `point` (a Chinchilla multiple) starts from: the
        grid's winner up to the sweep's horizon, its continuation (`constant`) after."""
        lr = self.trunk_lr(finished)
        if lr is None:
            return None
        before = point < self.sweep_horizon or math.isclose(point, self.sweep_horizon)
        if self.constant_lr == "tuned" and before:
            return self.constant_grid().run_name(lr)
        return "constant"

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

    def wsd(self, prefix: str, horizon: float, trunk: Path, lr: float) -> dict[str, Any]:
        """The WSD branch `prefix` at `horizon` off the trunk of LR `lr` at `trunk`."""
        share, cooldown, floor = WSD[prefix]
        run = self.trunk(lr, self.top)
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
        if self.has_trunk and self.constant_lr == "tuned":
            out.append(self.constant_grid())
        return out

    def grid_run(self, spec: GridSpec, lr: float) -> dict[str, Any]:
        """The config of grid `spec`'s run at `lr`."""
        if spec.kind == "schedulefree":
            return self.schedulefree(lr, spec.horizon, None)
        if spec.kind == "constant":
            return self.trunk(lr, spec.horizon)
        return self.horizon_aware(spec.kind, spec.horizon, lr)

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
        for spec in self.grids(finished):
            for lr in spec.to_run(finished):
                runs[spec.run_name(lr)] = self.grid_run(spec, lr)
        # Branches and continuations look their checkpoint up only while they are to run: an
        # ended one needs nothing of its trunk (whose checkpoints may be pruned since).
        if self.has_trunk and "constant" not in done:
            runs |= self._constant(finished, checkpoint_at)
        if "wsd" in self.methods:
            runs |= self._branches(finished, checkpoint_at, done)
        if "schedulefree" in self.methods and "schedulefree" not in done:
            spec = self.schedulefree_grid()
            best = spec.pick(finished)
            if best is not None and self.top > spec.horizon:
                start = checkpoint_at(spec.run_name(best), spec.horizon)
                runs["schedulefree"] = self.schedulefree(best, self.top, str(start))
        for name, config in runs.items():  # validated here, not inside a trial
            parse(TrainConfig, config, f"transfer run {name}")
        return {name: config for name, config in runs.items() if name not in done}

    def _constant(self, finished: dict[str, History], checkpoint_at: CheckpointAt) -> dict:
        """The constant trunk to the largest horizon: at once at the recipe's AdamW LR, or, by
        the "tuned" rule, once its grid has picked, continued from the winner's checkpoint."""
        lr = self.trunk_lr(finished)
        if lr is None:
            return {}
        if self.constant_lr == "recipe":
            return {"constant": self.trunk(lr, self.top)}
        winner = self.constant_grid().run_name(lr)
        start = checkpoint_at(winner, self.sweep_horizon)
        return {"constant": self.trunk(lr, self.top, str(start))}

    def _branches(
        self, finished: dict[str, History], checkpoint_at: CheckpointAt, done: set[str]
    ) -> dict:
        """Every WSD branch not yet run whose trunk (the run its branch point lies on) has
        finished."""
        runs: dict[str, dict[str, Any]] = {}
        lr = self.trunk_lr(finished)
        if lr is None:
            return runs
        for prefix, (share, _, _) in WSD.items():
            for h in self.horizons:
                point = (1 - share) * h
                trunk = self.trunk_run(point, finished)
                name = f"{prefix}-{h:g}x"
                if name not in done and trunk in finished:
                    runs[name] = self.wsd(prefix, h, checkpoint_at(trunk, point), lr)
        return runs
