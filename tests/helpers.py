"""Shared test utilities: run a function on N real gloo ranks, write configs and recipes, read
JSON as strict parsers do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import yaml

from schedule_search.recipe import RECIPE_FORMAT, RecipeSpec, write_recipe
from schedule_search.store.experiment import Experiment, SweepSettings
from schedule_search.store.facts import SweepFacts, write_facts
from schedule_search.train import launch
from schedule_search.train.config import TrainConfig
from schedule_search.train.evaluation import Evaluation

#: The repository (README.md, search_spaces/, schedule_search/) and the tests' data files.
REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"


def _single_threaded(rank: int, world: int, fn: Any, *args: Any) -> Any:
    torch.set_num_threads(1)  # two ranks on two cores: no oversubscription
    return fn(rank, world, *args)


def run_ranks(fn: Any, world: int, *args: Any) -> list[Any]:
    """Run `fn(rank, world, *args)` in `world` gloo processes (forked from a preloaded
    forkserver), one thread each; return their results by rank (the package's own launcher)."""
    return launch.run_ranks(_single_threaded, world, fn, *args)


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


#: A recipe file's contents that load (the fuzzers edit it; test_export breaks it).
GOOD_RECIPE = {
    "format": 1,
    "optimizer": {"name": "adamw", "lr": 0.003},
    "schedule": {"kind": "poly", "gamma": 0.5, "alpha": 0.05, "warmup": 0.05},
    "ema": {"fractions": [0.0, 0.04], "objective": 0.04},
    "window": {"policy": "microbatches", "microbatches": 2},
    "n_params": 1000,
    "tokens_per_param": 20.0,
    "tokens_per_reference_step": 100.0,
}


def recipe_file(path, n_params: int, tokens_per_reference_step: float, microbatches: int = 1):
    """A recipe of the default training config, written as `export` writes one."""
    config = TrainConfig()
    config.window.microbatches = microbatches
    spec = RecipeSpec(
        format=RECIPE_FORMAT,
        optimizer=config.optimizer,
        schedule=config.schedule,
        ema=config.ema,
        window=config.window,
        n_params=n_params,
        tokens_per_param=20.0,
        tokens_per_reference_step=tokens_per_reference_step,
    )
    write_recipe(path, spec)
    return path


def strict_loads(text: str) -> Any:
    """json.loads that refuses NaN and Infinity, as jq, browsers and RFC 8259 parsers do."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def one_trial_sweep(root, warmup: float) -> Experiment:
    """A sweep to 1x of one completed linreg trial whose LR warms up over `warmup`x."""
    sweep = Experiment(root)
    root.mkdir(parents=True)
    sweep.save_settings(SweepSettings(name=root.name, samples=1, workers=1, concurrency=1))
    write_facts(root, SweepFacts(1.0, [0.5, 1.0], 20.0, 64, 16.0))
    config = {
        "task": {"name": "linreg", "dim": 64, "batch": 16},
        "optimizer": {"name": "sgd", "lr": 0.1},
        "schedule": {"kind": "poly", "warmup": warmup, "alpha": 4.0},
        "budget": {"horizon": 1.0, "eval_at": [0.5]},
    }
    sweep.write_trial_json("t0", "config.json", {"params": {}, "config": config})
    history = [
        Evaluation(
            tokens=int(t * 1280),
            chinchilla=t,
            val_loss=v,
            milestone=m,
            ema_fraction=0.0,
            losses={0.0: v},
        )
        for m, (t, v) in enumerate([(0.5, 2.0), (1.0, 1.5)], start=1)
    ]
    sweep.write_trial_json("t0", "metrics.json", [e.to_metrics() for e in history])
    sweep.write_trial_json(
        "t0", "result.json", {"state": "completed", "reason": "", "val_loss": 1.5}
    )
    return sweep
