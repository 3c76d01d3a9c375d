"""Which sampler the sweep should ship, and what the EMA bank buys: searches at the same
compute over the anytime family (LR on a log scale, gamma, alpha on a log scale in Chinchilla
multiples), on linreg and on a small tinylm.

Compute is counted in Chinchilla multiples trained (a trial stopped at 1x costs 1). A dense
grid (every point trained to the horizon, each scored with the best EMA of its bank) sets the
reference: its best loss and its compute. For every method the figure is the compute spent
when a trial first comes within 1% of the grid's best loss, as a fraction of the grid's
compute (inf: not within the grid's compute); median over seeds. (On a smaller tinylm, d_model
16, every method came within 1% in its first trials: too flat a task to tell samplers apart.)

Methods (all Optuna's own samplers and pruner, seeded):
- TPE + halving: the sweep's TPE (`sweep.optuna_study.tpe_sampler`) with successive halving
  (rungs at 1x and 2x, reduction factor 2: the sweep's ASHA); pruned trials are told PRUNED.
- GP: Optuna's GPSampler; it learns from completed trials only, so it runs without halving.
- random + halving: random search under the same successive halving.
- grid: the grid's own points in a seeded random order.
Three ways for the EMA fraction, with TPE + halving:
- bank: every trial keeps the bank and reports its best fraction (what the sweep does);
- fraction as a dimension: one EMA a trial, its fraction searched (log, 0.005-0.32);
- every fraction a point: the bank, and each fraction told to the study as its own trial.

Trials run through the core trainer (`train.loop.train`, the loop the sweep's Ray Train workers
run), not through Ray, whose per-trial start-up (about 10 s) would dominate trials this small.
Grid points, and the searches of each method and seed, run in parallel processes of one thread.

Run: `python bench/search.py [--seeds N] [--task linreg|tinylm|both] [--jobs N]`.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import statistics
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import torch

from schedule_search.core.averaging import DEFAULT_FRACTIONS, loss_key
from schedule_search.core.config import parse
from schedule_search.sweep.optuna_study import make_sampler
from schedule_search.sweep.space import STARTUP_TRIALS
from schedule_search.train.config import TrainConfig
from schedule_search.train.loop import train

optuna.logging.set_verbosity(optuna.logging.WARNING)

#: The anytime family's ranges, as in search_spaces/default.yaml.
ALPHA = (0.4, 40.0)
GAMMA = (0.0, 1.0)
FRACTION = (0.005, 0.32)
BANK = {"fractions": list(DEFAULT_FRACTIONS), "objective": "best"}
TASKS = {
    "linreg": {
        "base": {
            "task": {"name": "linreg", "dim": 128, "batch": 16},
            "optimizer": {"name": "sgd"},
            "schedule": {"kind": "poly", "warmup": 0.0},
            "window": {"microbatches": 1, "clip_norm": None},
        },
        "lr": (0.01, 1.0),
        "grid": (6, 3, 3),  # LRs x gammas x alphas
    },
    "tinylm": {
        "base": {
            "task": {
                "name": "tinylm",
                "d_model": 32,
                "n_layer": 1,
                "n_head": 2,
                "batch": 4,
                "max_bytes": 1_000_000,
                "eval_batches": 8,
            },
            "schedule": {"kind": "poly", "warmup": 0.4},
            "window": {"microbatches": 1},
        },
        "lr": (1e-3, 1e-1),
        "grid": (4, 3, 3),
    },
}
HORIZON = 4.0
RUNGS = (1.0, 2.0)
#: The compute of the default sweep (search_spaces/default.yaml, measured): 3 trials to 4x,
#: 1 stopped at 2x, 6 stopped at 1x = 20 Chinchilla multiples.
SWEEP_BUDGET = 20.0


@dataclass(frozen=True)
class Method:
    sampler: str  # tpe | gp | random | grid
    halving: bool
    ema: str = "bank"  # bank | dimension | points


METHODS = {
    "TPE + halving": Method("tpe", True),
    "GP": Method("gp", False),
    "random + halving": Method("random", True),
    "grid (random order)": Method("grid", False),
    "TPE + halving (EMA fraction as a dimension)": Method("tpe", True, "dimension"),
    "TPE + halving (every EMA fraction a point)": Method("tpe", True, "points"),
}


class _PruningSession:
    """A Session for one in-process trial: reports each evaluation to Optuna and stops the
    run (TrialPruned) where successive halving says so. No checkpoints: nothing resumes."""

    rank, world_size = 0, 1

    def __init__(self, log_dir: Path, trial: optuna.Trial | None) -> None:
        self.log_dir = log_dir
        self.trial = trial
        self.reached = 0.0

    def device(self) -> torch.device:
        return torch.device("cpu")

    def latest_state(self) -> None:
        return None

    def report(self, metrics: dict[str, Any], state: dict[str, Any] | None) -> None:
        self.reached = metrics["chinchilla"]
        if self.trial is not None and metrics["chinchilla"] in RUNGS:
            self.trial.report(metrics["val_loss"], step=int(metrics["milestone"]))
            if self.trial.should_prune():
                raise optuna.TrialPruned()

    def save(self, state: dict[str, Any]) -> None:
        pass


class _Pruned(Exception):
    def __init__(self, reached: float) -> None:
        self.reached = reached


def run_trial(
    task: str, point: dict[str, float], trial: optuna.Trial | None = None
) -> tuple[dict[float, float], float]:
    """({EMA fraction: validation loss at the horizon}, Chinchilla multiples trained).
    `point` holds lr, gamma, alpha and, for one EMA a trial, ema_fraction."""
    tree = {**TASKS[task]["base"], "seed": 0}
    tree["optimizer"] = {**tree.get("optimizer", {}), "lr": point["lr"]}
    tree["schedule"] = {**tree["schedule"], "gamma": point["gamma"], "alpha": point["alpha"]}
    frac = point.get("ema_fraction")
    tree["ema"] = BANK if frac is None else {"fractions": [frac], "objective": frac}
    tree["budget"] = {"horizon": HORIZON, "eval_at": list(RUNGS)}
    config = parse(TrainConfig, tree, f"bench {task}")
    with tempfile.TemporaryDirectory() as folder:
        session = _PruningSession(Path(folder), trial)
        try:
            result = train(config, session, "bench")
        except optuna.TrialPruned:
            raise _Pruned(session.reached) from None
    final = result.history[-1]
    losses = {f: final.get(loss_key(f), math.inf) for f in config.ema.fractions}
    return {f: (v if math.isfinite(v) else math.inf) for f, v in losses.items()}, HORIZON


def grid_points(task: str) -> list[dict[str, float]]:
    n_lr, n_gamma, n_alpha = TASKS[task]["grid"]
    lrs = np.geomspace(*TASKS[task]["lr"], n_lr).tolist()
    gammas = np.linspace(*GAMMA, n_gamma).tolist()
    alphas = np.geomspace(*ALPHA, n_alpha).tolist()
    return [
        {"lr": lr, "gamma": g, "alpha": a} for lr, g, a in itertools.product(lrs, gammas, alphas)
    ]


def grid(pool: ProcessPoolExecutor, task: str) -> list[tuple[dict[str, float], float]]:
    """Every grid point with its best-of-bank loss at the horizon."""
    points = grid_points(task)
    results = pool.map(run_trial, itertools.repeat(task), points)
    return [(p, min(losses.values())) for p, (losses, _) in zip(points, results, strict=True)]


def _ask(trial: optuna.Trial, task: str, method: Method) -> dict[str, float]:
    point = {
        "lr": trial.suggest_float("lr", *TASKS[task]["lr"], log=True),
        "gamma": trial.suggest_float("gamma", *GAMMA),
        "alpha": trial.suggest_float("alpha", *ALPHA, log=True),
    }
    if method.ema == "dimension":
        point["ema_fraction"] = trial.suggest_float("ema_fraction", *FRACTION, log=True)
    elif method.ema == "points":
        trial.suggest_categorical("ema_fraction", list(DEFAULT_FRACTIONS))
    return point


def _tell_every_fraction(study: optuna.Study, trial: optuna.Trial, losses: dict[float, float]):
    """The asked trial gets its suggested fraction's loss; every other fraction of the bank is
    added as a completed trial of its own."""
    asked = trial.params["ema_fraction"]
    study.tell(trial, losses[asked])
    distributions = trial.distributions
    for frac, loss in losses.items():
        if frac != asked:
            study.add_trial(
                optuna.trial.create_trial(
                    params={**trial.params, "ema_fraction": frac},
                    distributions=distributions,
                    value=loss,
                )
            )


def search(
    task: str, name: str, seed: int, target: float, budget: float, grid_order: list
) -> tuple[float | None, float]:
    """(compute spent when a trial first reaches `target`, or None within `budget`; the best
    loss found within the default sweep's compute, `SWEEP_BUDGET`)."""
    method = METHODS[name]
    spent, reached, best_in_sweep = 0.0, None, math.inf

    def record(loss: float) -> None:
        nonlocal reached, best_in_sweep
        if spent <= SWEEP_BUDGET:
            best_in_sweep = min(best_in_sweep, loss)
        if reached is None and loss <= target:
            reached = spent

    def done() -> bool:
        return spent >= budget or (reached is not None and spent >= SWEEP_BUDGET)

    if method.sampler == "grid":
        for i in np.random.default_rng(seed).permutation(len(grid_order)):
            spent += HORIZON
            record(grid_order[i][1])
            if done():
                break
        return reached, best_in_sweep
    pruner = (
        optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=2)
        if method.halving
        else optuna.pruners.NopPruner()
    )
    study = optuna.create_study(
        sampler=make_sampler(method.sampler, seed, STARTUP_TRIALS), pruner=pruner
    )
    while not done():
        trial = study.ask()
        point = _ask(trial, task, method)
        try:
            losses, cost = run_trial(task, point, trial if method.halving else None)
        except _Pruned as pruned:
            spent += pruned.reached
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        spent += cost
        if method.ema == "points":
            _tell_every_fraction(study, trial, losses)
        else:
            study.tell(trial, min(losses.values()))
        record(min(losses.values()))
    return reached, best_in_sweep


def _one_thread() -> None:
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--task", choices=["linreg", "tinylm", "both"], default="both")
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--methods", default=";".join(METHODS), help="';'-separated subset")
    args = parser.parse_args()
    tasks = ["linreg", "tinylm"] if args.task == "both" else [args.task]
    methods = [m for m in args.methods.split(";") if m]
    print(
        "| task | grid: points, compute, best loss (its point) | method | compute to within 1% "
        "of the grid's best, / grid's (median of seeds) | per seed | best within the default "
        f"sweep's {SWEEP_BUDGET:g}x, minus the grid's best (median) |"
    )
    print("|" + " --- |" * 6)
    context = get_context("spawn")  # no fork of a process that may hold torch's thread pools
    with ProcessPoolExecutor(args.jobs, mp_context=context, initializer=_one_thread) as pool:
        for task in tasks:
            scored = grid(pool, task)
            best_point, best = min(scored, key=lambda item: item[1])
            compute = HORIZON * len(scored)
            where = ", ".join(f"{k} {v:.3g}" for k, v in best_point.items())
            runs = {
                (name, seed): pool.submit(search, task, name, seed, best * 1.01, compute, scored)
                for name in methods
                for seed in range(args.seeds)
            }
            for name in methods:
                results = [runs[name, seed].result() for seed in range(args.seeds)]
                fractions = [s / compute if s is not None else math.inf for s, _ in results]
                within = statistics.median(b - best for _, b in results)
                print(
                    f"| {task} | {len(scored)}, {compute:g}x, {best:.4g} ({where}) | {name} | "
                    f"{statistics.median(fractions):.2f} | "
                    f"{', '.join(f'{f:.2f}' for f in fractions)} | {within:+.3g} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
