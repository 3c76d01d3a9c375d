"""Does a larger window (more micro-batches per optimizer step) pay at the sweep's objective?

The default sweep scores every trial by its loss at 4x Chinchilla tokens. At a fixed token
count a window of k micro-batches a worker takes k times fewer optimizer steps on a k times
larger batch. This trains the family grid's three reference points (schedule-free's seeded
point, schedule-free's best and the anytime family's best: bench/results/family-search/
grid.jsonl) with 1, 2 and 4 micro-batches a worker of a 2-worker sweep trial (one rank here
with 2, 4 and 8 micro-batches a window: the same tokens per step and the same data,
`tasks.protocol.stream_generator`), and schedule-free's best with 2 a worker at LRs x sqrt(2)
and x2 (a larger batch may want a larger LR). Each is trained to 4x as the grid trains
(`family_search.train_point`: one thread, the objective the best EMA of the bank), its CPU
stamped on the row (its 1-micro-batch row is then this CPU's own baseline: kernels of
different CPUs move a 4x loss by up to 0.02).

Run: `python bench/window_size.py` (about 25 minutes on 2 cores: 11 runs, 2 at a time;
resumable: a point already in the table for this CPU is skipped). Rows are appended to
bench/results/family-search/window.jsonl.
"""

from __future__ import annotations

import json
import math
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

from family_search import MICROBATCHES, REPO, cpu, train_point

from schedule_search.sweep.space import load_space

TABLE = REPO / "bench" / "results" / "family-search" / "window.jsonl"
SCHEDULEFREE_SEEDED = {
    "family": "schedulefree",
    "schedulefree:optimizer.lr": 0.0095,
    "schedulefree:schedule.warmup": 0.4,
    "schedulefree:optimizer.betas.0": 0.9,
}
#: The family grid's best point (and the grid's own best warmup, the range's top).
SCHEDULEFREE_BEST = {
    **SCHEDULEFREE_SEEDED,
    "schedulefree:optimizer.lr": 0.038,
    "schedulefree:schedule.warmup": 0.8,
}
ANYTIME_BEST = {
    "family": "anytime",
    "anytime:optimizer.lr": 0.012,
    "anytime:schedule.gamma": 0.5,
    "anytime:schedule.alpha": 0.4,
}
#: Micro-batches a window of one rank: a 2-worker sweep trial's 1, 2 and 4 a worker.
WINDOWS = (MICROBATCHES, 2 * MICROBATCHES, 4 * MICROBATCHES)


def points() -> list[dict]:
    out = [
        {**p, "window.microbatches": w}
        for p in (SCHEDULEFREE_SEEDED, SCHEDULEFREE_BEST, ANYTIME_BEST)
        for w in WINDOWS
    ]
    for factor in (math.sqrt(2), 2.0):
        lr = round(SCHEDULEFREE_BEST["schedulefree:optimizer.lr"] * factor, 3)
        out.append(
            {
                **SCHEDULEFREE_BEST,
                "schedulefree:optimizer.lr": lr,
                "window.microbatches": 2 * MICROBATCHES,
            }
        )
    return out


def _key(point: dict) -> str:
    return json.dumps(point, sort_keys=True)


def main() -> None:
    space = load_space(REPO / "search_spaces" / "default.yaml")
    rows = [json.loads(line) for line in TABLE.read_text().splitlines()] if TABLE.exists() else []
    done = {_key(r["point"]) for r in rows if r["cpu"] == cpu()}
    todo = [p for p in points() if _key(p) not in done]
    print(f"{len(points()) - len(todo)} points in {TABLE} for this CPU, {len(todo)} to train")
    with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
        for row in pool.map(train_point, [space] * len(todo), todo):
            with TABLE.open("a") as table:
                table.write(json.dumps(row) + "\n")
            rows.append(row)
            print(json.dumps(row), flush=True)
    print_table([r for r in rows if r["cpu"] == cpu()])


def _without_window(point: dict) -> str:
    return _key({k: v for k, v in point.items() if k != "window.microbatches"})


def print_table(rows: list[dict]) -> None:
    """Each row's 4x loss minus its point's at 1 micro-batch a worker (the LR variants: minus
    schedule-free's best at its own LR and 1 a worker)."""
    one = {
        _without_window(r["point"]): r["losses"]["4"]
        for r in rows
        if r["point"]["window.microbatches"] == MICROBATCHES
    }
    print("\n| point | micro-batches a worker | 4x | minus the point at 1 a worker |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        point = r["point"]
        base = one.get(_without_window(point), one.get(_key(SCHEDULEFREE_BEST)))
        gap = "-" if base is None else f"{r['losses']['4'] - base:+.4f}"
        shown = {k.split(":")[-1]: v for k, v in point.items() if k != "window.microbatches"}
        per_worker = point["window.microbatches"] // MICROBATCHES
        print(f"| {shown} | {per_worker} | {r['losses']['4']:.4f} | {gap} |")


if __name__ == "__main__":
    main()
