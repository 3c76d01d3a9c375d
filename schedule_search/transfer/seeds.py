"""Seeds of a transfer study: what a single run cannot tell apart from noise.

A study of K seeds trains every row again with seeds 1..K-1 (the config's `seed`: the model's
initialization and the order of the training data): the recipe, constant + EMA (at the LR its
grid picked) and its WSD branches, schedule-free AdamW at the LR its grid picked, and for each
envelope kind and horizon the LR its grid picked (the grids themselves are seed 0 alone: they
choose, the seeds measure). A replica is named after its seed-0 run (`cosine-8x-lr0.0079@seed2`) and
starts once that run's choice is settled; every replica trains from token 0 (the sweep's
checkpoint the recipe continues from is seed 0's), WSD replicas branch off their own seed's
trunk. Every run, whatever its seed, is scored on the task's one held-out sample, and gaps
are compared seed by seed.
"""

from __future__ import annotations

import copy
from typing import Any

from schedule_search.core.config import parse
from schedule_search.train.config import TrainConfig
from schedule_search.transfer.plan import WSD, CheckpointAt, TransferStudy
from schedule_search.transfer.scores import History

__all__ = ["SEED_MARK", "pending_with_seeds", "seed_of", "seeded"]

SEED_MARK = "@seed"


def seeded(name: str, seed: int) -> str:
    """The name of seed `seed`'s replica of run `name` (seed 0 is the run itself)."""
    return name if seed == 0 else f"{name}{SEED_MARK}{seed}"


def seed_of(name: str) -> tuple[str, int]:
    """(the seed-0 run's name, the seed) of a run name."""
    base, mark, seed = name.rpartition(SEED_MARK)
    return (base, int(seed)) if mark and seed.isdigit() else (name, 0)


def _with_seed(config: dict[str, Any], study: TransferStudy, seed: int) -> dict[str, Any]:
    run = copy.deepcopy(config)
    run["seed"] = study.base.seed + seed
    return run


def _settled_runs(study: TransferStudy, finished: dict[str, History]) -> dict[str, dict[str, Any]]:
    """Seed-0 run name -> the config its replicas train, for every row whose choice is settled:
    the recipe at once; the constant trunk and schedule-free once each has its LR (trained
    from token 0 to the largest horizon); each envelope grid's pick once the grid needs no
    more runs."""
    out: dict[str, dict[str, Any]] = {}
    if "recipe" in study.methods:
        out["recipe"] = {**study.recipe(), "branch_from": None}
    trunk_lr = study.trunk_lr(finished) if study.has_trunk else None
    if trunk_lr is not None:
        out["constant"] = study.trunk(trunk_lr, study.top)
    if "schedulefree" in study.methods:
        best = study.schedulefree_grid().pick(finished)
        if best is not None:
            out["schedulefree"] = study.schedulefree(best, study.top, None)
    for kind in study.envelope_kinds:
        for h in study.horizons:
            grid = study.grid(kind, h, finished)
            if grid is None or grid.to_run(finished):
                continue
            best = grid.state(finished).best_lr
            if best is not None:
                out[grid.run_name(best)] = study.grid_run(grid, best)
    return out


def pending_with_seeds(
    study: TransferStudy,
    seeds: int,
    finished: dict[str, History],
    checkpoint_at: CheckpointAt,
    ended: frozenset[str] = frozenset(),
) -> dict[str, dict[str, Any]]:
    """`study.pending` and every replica of seeds 1..`seeds`-1 that can start now."""
    runs = study.pending(finished, checkpoint_at, ended)
    if seeds <= 1:
        return runs
    trunk_lr = study.trunk_lr(finished) if study.has_trunk else None
    done = finished.keys() | ended
    settled = _settled_runs(study, finished)
    for seed in range(1, seeds):
        for name, config in settled.items():
            runs[seeded(name, seed)] = _with_seed(config, study, seed)
        trunk = seeded("constant", seed)
        if "wsd" in study.methods and trunk in finished and trunk_lr is not None:
            for prefix, (share, _, _) in WSD.items():
                for h in study.horizons:
                    if (name := seeded(f"{prefix}-{h:g}x", seed)) not in done:
                        start = checkpoint_at(trunk, (1 - share) * h)
                        branch = study.wsd(prefix, h, start, trunk_lr)
                        runs[name] = _with_seed(branch, study, seed)
    for name, config in runs.items():  # validated here, not inside a trial
        parse(TrainConfig, config, f"transfer run {name}")
    return {name: config for name, config in runs.items() if name not in done}
