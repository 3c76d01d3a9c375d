"""The search at the same compute: TPE + successive halving against random search and a dense
grid, on linreg and on a small tinylm, over LR (log) and the schedule's gamma.

Compute is counted in Chinchilla multiples trained (a trial stopped at 1x costs 1). The grid
(every point trained to the horizon) sets the reference: its best loss and its compute. For
random search and TPE + halving (Optuna's TPESampler and SuccessiveHalvingPruner, the same
asynchronous successive halving as the sweep's ASHA: rungs at 1x and 2x, reduction factor 2),
the figure is the compute spent when a trial first reaches within 1% of the grid's best loss,
as a fraction of the grid's compute; median over seeds. Goal for TPE + halving: <= 1/3.

Two TPEs: with Optuna's defaults (10 random start-up trials, one density per key) and as the
sweep runs it (`optuna_study.tpe_sampler`: the space's `startup_trials`, multivariate).

Trials run through the core trainer (`train.train`, the same loop the sweep's Ray Train
workers run) rather than through Ray, whose per-trial start-up (about 10 s, see the
sweep-efficiency figure) would dominate trials this small; the algorithms are Optuna's own.
Grid points, and the searches of each method and seed, run in parallel processes of one
thread each (`--jobs`, default: every core): the figures count compute, not time.

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
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import torch

from schedule_search.config import parse
from schedule_search.optuna_study import tpe_sampler
from schedule_search.space import STARTUP_TRIALS
from schedule_search.train import TrainConfig, train

optuna.logging.set_verbosity(optuna.logging.WARNING)

TASKS = {
    "linreg": {
        "base": {
            "task": {"name": "linreg", "dim": 128, "batch": 16},
            "optimizer": {"name": "sgd", "lr": 0.1},
            "schedule": {"kind": "poly", "alpha": 0.05, "warmup": 0.05},
            "ema": {"fractions": [0.04], "objective": 0.04},
            "budget": {"horizon": 4.0, "eval_at": [1.0, 2.0]},
        },
        "lr": (0.01, 1.0),
        "grid_lr": 8,
        "grid_gamma": 5,
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
            "schedule": {"kind": "poly", "alpha": 0.05, "warmup": 0.05},
            "ema": {"fractions": [0.04], "objective": 0.04},
            "budget": {"horizon": 4.0, "eval_at": [1.0, 2.0]},
        },
        "lr": (1e-3, 1e-1),
        "grid_lr": 5,
        "grid_gamma": 3,
    },
}
RUNGS = (1.0, 2.0)
METHODS = {  # name -> (sampler for a seed, successive halving)
    "random": (lambda seed: optuna.samplers.RandomSampler(seed=seed), False),
    "TPE (Optuna's defaults) + halving": (
        lambda seed: optuna.samplers.TPESampler(seed=seed),
        True,
    ),
    f"TPE (the sweep's: {STARTUP_TRIALS} start-up, multivariate) + halving": (
        lambda seed: tpe_sampler(seed, STARTUP_TRIALS),
        True,
    ),
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
            self.trial.report(metrics["val_loss"], step=int(metrics["chinchilla"]))
            if self.trial.should_prune():
                raise optuna.TrialPruned()

    def save(self, state: dict[str, Any]) -> None:
        pass


def run_trial(task: str, lr: float, gamma: float, trial: optuna.Trial | None = None):
    """(validation loss at the horizon or at the pruning rung, Chinchilla multiples trained)."""
    tree = {**TASKS[task]["base"], "seed": 0, "window": {"microbatches": 1}}
    tree["optimizer"] = {**tree.get("optimizer", {}), "lr": lr}
    tree["schedule"] = {**tree["schedule"], "gamma": gamma}
    config = parse(TrainConfig, tree, f"bench {task}")
    with tempfile.TemporaryDirectory() as folder:
        session = _PruningSession(Path(folder), trial)
        try:
            result = train(config, session, "bench")
        except optuna.TrialPruned:
            raise _Pruned(session.reached) from None
    loss = result.history[-1]["val_loss"]
    return (loss if math.isfinite(loss) else math.inf), config.budget.horizon


class _Pruned(Exception):
    def __init__(self, reached: float) -> None:
        self.reached = reached


def grid(pool: ProcessPoolExecutor, task: str) -> tuple[float, float]:
    """(best loss, compute) of the dense grid: log-spaced LRs x evenly spaced gammas."""
    spec = TASKS[task]
    lrs = np.geomspace(*spec["lr"], spec["grid_lr"])
    gammas = np.linspace(0.0, 1.0, spec["grid_gamma"])
    points = list(itertools.product(lrs.tolist(), gammas.tolist()))
    results = list(
        pool.map(run_trial, itertools.repeat(task), [p[0] for p in points], [p[1] for p in points])
    )
    return min(loss for loss, _ in results), sum(cost for _, cost in results)


def search(task: str, method: str, seed: int, target: float, budget: float) -> float | None:
    """Compute spent when a trial first reaches `target`, or None within `budget`."""
    make_sampler, halving = METHODS[method]
    sampler = make_sampler(seed)
    pruner = (
        optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=2)
        if halving
        else optuna.pruners.NopPruner()
    )
    study = optuna.create_study(sampler=sampler, pruner=pruner)
    low, high = TASKS[task]["lr"]
    spent = 0.0
    while spent < budget:
        trial = study.ask()
        lr = trial.suggest_float("lr", low, high, log=True)
        gamma = trial.suggest_float("gamma", 0.0, 1.0)
        try:
            loss, cost = run_trial(task, lr, gamma, trial if halving else None)
        except _Pruned as pruned:
            spent += pruned.reached
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        spent += cost
        study.tell(trial, loss)
        if loss <= target:
            return spent
    return None


def _one_thread() -> None:
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--task", choices=["linreg", "tinylm", "both"], default="both")
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    args = parser.parse_args()
    tasks = ["linreg", "tinylm"] if args.task == "both" else [args.task]
    print(
        "| task | grid: points, compute, best loss | method | compute to within 1% of the "
        "grid's best, / grid's (median of seeds) | per seed |"
    )
    print("|" + " --- |" * 5)
    context = get_context("spawn")  # no fork of a process that may hold torch's thread pools
    with ProcessPoolExecutor(args.jobs, mp_context=context, initializer=_one_thread) as pool:
        for task in tasks:
            spec = TASKS[task]
            best, compute = grid(pool, task)
            points = spec["grid_lr"] * spec["grid_gamma"]
            runs = {
                (method, seed): pool.submit(search, task, method, seed, best * 1.01, compute)
                for method in METHODS
                for seed in range(args.seeds)
            }
            for method in METHODS:
                spent = [runs[method, seed].result() for seed in range(args.seeds)]
                fractions = [s / compute if s is not None else math.inf for s in spent]
                print(
                    f"| {task} | {points}, {compute:g}x, {best:.4g} | {method} | "
                    f"{statistics.median(fractions):.2f} | "
                    f"{', '.join(f'{f:.2f}' for f in fractions)} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
