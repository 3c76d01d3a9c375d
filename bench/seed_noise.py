"""How far one config's 4x loss moves when only chance changes (the seed: model initialization
and data order; every seed is scored on one held-out sample, `tinylm.HELD_OUT_KEY`), and
whether a sweep trial's layout (2 Ray Train workers x 1 micro-batch a window) scores what the
family-search grid's (1 rank x 2) scores: both draw one stream
(`tasks.protocol.stream_generator`), so they should agree but for the order in which each
window's gradients are summed.

Run: `python bench/seed_noise.py` (about 8 minutes on 2 cores: 4 runs of the default task to 4x,
2 at a time). Rows are appended to bench/results/family-search/noise.jsonl.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path

import torch
from family_search import cpu

from schedule_search.sweep.space import load_space, trial_config
from schedule_search.tasks.tinylm import HELD_OUT_KEY
from schedule_search.train.launch import run_local

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "bench" / "results" / "family-search" / "noise.jsonl"
#: The default space's schedule-free seeded point (search_spaces/default.yaml).
POINT = {
    "family": "schedulefree",
    "schedulefree:optimizer.lr": 9.5e-3,
    "schedulefree:schedule.warmup": 0.4,
    "schedulefree:optimizer.betas.0": 0.9,
}
TOKENS_PER_STEP = 2  # micro-batches a window, over all ranks


def train_layout(job: tuple[int, int]) -> dict:
    """POINT trained to the default space's 4x with `seed`, on `ranks` gloo ranks."""
    seed, ranks = job
    torch.set_num_threads(1)
    space = load_space(REPO / "search_spaces" / "default.yaml")
    values = {**POINT, "window.microbatches": TOKENS_PER_STEP // ranks}
    config = replace(trial_config(space, values, "noise"), seed=seed)
    with tempfile.TemporaryDirectory() as folder:
        result = run_local(config, folder, workers=ranks, source="noise")
    losses = {f"{row['chinchilla']:g}": row["val_loss"] for row in result.history}
    # Rows without "held_out" were scored on the sample their seed drew (before HELD_OUT_KEY).
    return {
        "point": POINT,
        "seed": seed,
        "ranks": ranks,
        "losses": losses,
        "held_out": HELD_OUT_KEY,
        "cpu": cpu(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds on 1 rank (default 3)")
    args = parser.parse_args()
    jobs = [(seed, 1) for seed in range(args.seeds)] + [(0, 2)]
    rows = []
    with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
        for row in pool.map(train_layout, jobs):
            rows.append(row)
            with TABLE.open("a") as table:
                table.write(json.dumps(row) + "\n")
            print(f"seed {row['seed']}, {row['ranks']} rank(s): 4x {row['losses']['4']:.4f}")
    by_seed = [r["losses"]["4"] for r in rows if r["ranks"] == 1]
    two_ranks = next(r["losses"]["4"] for r in rows if r["ranks"] == 2)
    if len(by_seed) > 1:
        print(f"over {len(by_seed)} seeds: range {max(by_seed) - min(by_seed):.4f}, ", end="")
        print(f"sd {statistics.stdev(by_seed):.4f}")
    print(f"seed 0, 2 ranks x 1 minus 1 rank x 2: {two_ranks - by_seed[0]:+.6f}")


if __name__ == "__main__":
    main()
