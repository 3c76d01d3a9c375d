"""How far a loss, and a difference of two losses, moves with the held-out sample alone.

1. Trains the default task (tinylm on the embedded corpus, its default config) once to the
   horizon given (4x by default), then scores that one model on the held-out spans each of
   seeds 0-9 drew while every seed drew its own (the generator keys `(seed, 0, i, 1)`), and
   through `evaluate` with tasks of two seeds, which now share `tinylm.HELD_OUT_KEY`'s
   sample. The spread is what a per-seed held-out sample added to every spread across seeds.
2. With `--pair`: schedule-free's seeded point of the default space and the family grid's
   best (BENCHMARKS.md: 1.1782 and 1.1578 at 4x), each trained to 4x as the grid trains them
   (1 rank x 2 micro-batches), every evaluation scored on those ten samples too; prints the
   difference of their objectives (the best of the EMA bank, schedule-free's averaged
   weights) on each. Its spread is how finely one held-out sample tells two configs apart.

Run: `python bench/heldout_noise.py [HORIZON]` (about 4 minutes on 2 cores at 4x);
`python bench/heldout_noise.py --pair` (about 9 minutes, 2 runs at a time).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch
from seed_noise import POINT

from schedule_search.core import checkpoint
from schedule_search.core.config import parse
from schedule_search.sweep.space import load_space, trial_config
from schedule_search.tasks.registry import build_task
from schedule_search.tasks.tinylm import HELD_OUT_KEY, TinyLMConfig, TinyLMTask
from schedule_search.train.config import TrainConfig
from schedule_search.train.launch import run_local

REPO = Path(__file__).resolve().parents[1]
SEEDS = range(10)
#: Schedule-free's seeded point in search_spaces/default.yaml and the family grid's best.
PAIR = {
    "seeded": POINT,
    "grid best": POINT | {"schedulefree:optimizer.lr": 3.8e-2, "schedulefree:schedule.warmup": 0.8},
}
#: Each evaluation of a `heldout_noise:scored` task: its losses on the samples keys 0-9 drew.
SCORES: list[list[float]] = []


def trained_model(horizon: float) -> torch.nn.Module:
    config = parse(
        TrainConfig,
        {"task": {"name": "tinylm"}, "budget": {"horizon": horizon, "eval_at": []}},
        "heldout_noise",
    )
    with tempfile.TemporaryDirectory() as folder:
        run_local(config, folder)
        state = checkpoint.load_latest(Path(folder) / "checkpoints")[1]
    model = build_task({"name": "tinylm"}, 0).build_model()
    model.load_state_dict(state["model"])
    return model


class Scored(TinyLMTask):
    """tinylm whose every evaluation is also scored on the samples keys 0-9 drew (kept in
    SCORES); it returns what tinylm returns (key 0's)."""

    def evaluate(self, model: torch.nn.Module) -> float:
        SCORES.append([self.held_out_loss(model, key) for key in SEEDS])
        return SCORES[-1][HELD_OUT_KEY]


def scored(seed: int, **options: Any) -> Scored:
    """The user-task factory of `heldout_noise:scored`."""
    return Scored(parse(TinyLMConfig, options, "pair", "task"), seed, "pair")


def objective_on_samples(name: str) -> tuple[float, list[float]]:
    """PAIR[name] trained to 4x in this process: its objective as recorded, and the same
    evaluation (the bank member it picked) on each sample."""
    torch.set_num_threads(1)
    space = load_space(REPO / "search_spaces" / "default.yaml")
    config = trial_config(space, {**PAIR[name], "window.microbatches": 2}, "pair")
    config = replace(config, task=config.task | {"name": "heldout_noise:scored"})
    with tempfile.TemporaryDirectory() as folder:
        objective = run_local(config, folder, source="pair").history[-1]["val_loss"]
    # The task was imported by name (`heldout_noise`), not as this script's `__main__`: its
    # SCORES are that module's.
    from heldout_noise import SCORES as scores

    return objective, next(s for s in reversed(scores) if s[0] == objective)


def pair() -> None:
    with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
        results = dict(zip(PAIR, pool.map(objective_on_samples, PAIR), strict=True))
    for name, (objective, samples) in results.items():
        print(f"{name}: objective {objective:.4f}; on samples 0-9:")
        print("  " + " ".join(f"{loss:.4f}" for loss in samples))
    gaps = [a - b for a, b in zip(*(s for _, s in results.values()), strict=True)]
    print(f"seeded minus grid best: {' '.join(f'{g:+.4f}' for g in gaps)}")
    print(f"  mean {statistics.mean(gaps):+.4f}, sd {statistics.stdev(gaps):.4f}, ", end="")
    print(f"range {max(gaps) - min(gaps):.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("horizon", nargs="?", type=float, default=4.0)
    parser.add_argument("--pair", action="store_true", help="the two configs' difference")
    args = parser.parse_args()
    if args.pair:
        pair()
        return
    horizon = args.horizon
    model = trained_model(horizon)
    task = build_task({"name": "tinylm"}, 0)
    assert isinstance(task, TinyLMTask)
    losses = [task.held_out_loss(model, seed) for seed in SEEDS]
    print(f"one model trained to {horizon:g}x, scored on the samples seeds 0-9 drew:")
    print("  " + " ".join(f"{loss:.4f}" for loss in losses))
    print(f"  sd {statistics.stdev(losses):.4f}, range {max(losses) - min(losses):.4f}")
    shared = [build_task({"name": "tinylm"}, seed).evaluate(model) for seed in (0, 3)]
    print(f"evaluate() now, seeds 0 and 3: {shared[0]:.6f} {shared[1]:.6f}")


if __name__ == "__main__":
    main()
