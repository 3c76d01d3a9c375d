"""Does schedule-free's best warmup lie past the default space's range (0.1x-0.8x)?

The family grid's best point (schedule-free AdamW, LR 3.8e-2, beta 1 0.9) sat at the range's
top, warmup 0.8x (bench/results/family-search/grid.jsonl: 1.1578 at 4x, seed 0). This trains
that point with warmups 1.2x and 1.6x on seed 0, and 0.8x and 1.6x on seed 1 (so that 1.6x
against 0.8x is paired on two seeds), each to 4x as a sweep trial of the default space would
be (one rank, 2 micro-batches a window: the grid's layout and data), objective = the best
member of the EMA bank.

Run: `python bench/sf_warmup.py` (about 7 minutes on 2 cores: 4 runs, 2 at a time). Rows are
appended to bench/results/family-search/warmup.jsonl.
"""

from __future__ import annotations

import json
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path

import torch
from family_search import cpu
from search import _PruningSession

from schedule_search.sweep.space import load_space, trial_config
from schedule_search.train.loop import train

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "bench" / "results" / "family-search" / "warmup.jsonl"
#: The grid's best point, its warmup set per run.
POINT = {
    "family": "schedulefree",
    "window.microbatches": 2,
    "schedulefree:optimizer.lr": 0.038,
    "schedulefree:optimizer.betas.0": 0.9,
}
#: (warmup in Chinchilla multiples, seed); (0.8, 0) is the grid's own row.
JOBS = [(1.6, 0), (0.8, 1), (1.6, 1), (1.2, 0)]


def train_warmup(job: tuple[float, int]) -> dict:
    """POINT with warmup `job[0]` trained to 4x with seed `job[1]`: its objective per milestone."""
    warmup, seed = job
    torch.set_num_threads(1)
    space = load_space(REPO / "search_spaces" / "default.yaml")
    point = {**POINT, "schedulefree:schedule.warmup": warmup}
    config = replace(trial_config(space, point, "warmup"), seed=seed)
    with tempfile.TemporaryDirectory() as folder:
        result = train(config, _PruningSession(Path(folder), None), "warmup")
    losses = {f"{row['chinchilla']:g}": row["val_loss"] for row in result.history}
    return {"point": point, "seed": seed, "losses": losses, "cpu": cpu()}


def main() -> None:
    with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
        for row in pool.map(train_warmup, JOBS):
            with TABLE.open("a") as table:
                table.write(json.dumps(row) + "\n")
            warmup = row["point"]["schedulefree:schedule.warmup"]
            print(f"warmup {warmup:g}x, seed {row['seed']}: 4x {row['losses']['4']:.4f}")


if __name__ == "__main__":
    main()
