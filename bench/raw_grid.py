"""The AdamW half of the family grid again, recording the raw weights' losses (the last
iterate) beside the objective: what the forecast's AdamW law for the envelopes is fitted on.

bench/results/family-search/grid.jsonl holds each point's objective (the best EMA of the
bank) only, so the envelopes (scored by their last iterate) could not be forecast from it.
This trains the grid's 45 AdamW points (35 distinct runs: where gamma is 0, alpha changes
nothing) exactly as `family_search.py --grid` does (same configs, data, one thread a process,
2 at once) and writes, per point, the objective and the raw loss at 0.5x, 1x, 2x and 4x to
`bench/results/family-search/raw.jsonl`. The objective must equal grid.jsonl's to the last
digit on the same CPU (checked on every row: a run that trains otherwise is refused).
Resumable: each point is appended as it finishes and skipped on a rerun.

Usage: python bench/raw_grid.py   (about 50 minutes on 2 cores)
"""

from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

from family_search import REPO, TABLE, _key, _trained_as, cpu, grid_points, point_history

from schedule_search.core.averaging import loss_key
from schedule_search.sweep.space import SearchSpace, load_space

RAW_TABLE = TABLE.parent / "raw.jsonl"
FAMILY = "anytime"


def train_raw(space: SearchSpace, point: dict) -> dict:
    """The point trained as `family_search.train_point` trains it; its objective and raw
    weights' loss at each milestone."""
    history = point_history(space, point)
    losses = {f"{row['chinchilla']:g}": row["val_loss"] for row in history}
    raw = {f"{row['chinchilla']:g}": row[loss_key(0.0)] for row in history}
    return {"point": point, "losses": losses, "raw": raw, "cpu": cpu()}


def main() -> None:
    space = load_space(REPO / "search_spaces" / "default.yaml")
    objective = {_key(r["point"]): r for r in map(json.loads, TABLE.read_text().splitlines())}
    done = set()
    if RAW_TABLE.exists():
        done = {_key(json.loads(line)["point"]) for line in RAW_TABLE.read_text().splitlines()}
    todo: dict[str, list[dict]] = {}
    for point in grid_points():
        if point["family"] == FAMILY and _key(point) not in done:
            todo.setdefault(_trained_as(space, point), []).append(point)
    print(f"{len(done)} points in {RAW_TABLE}, {len(todo)} trainings to go", flush=True)
    with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
        firsts = [points[0] for points in todo.values()]
        trained = pool.map(train_raw, [space] * len(firsts), firsts)  # in order, as each ends
        for points, row in zip(todo.values(), trained, strict=True):
            for point in points:
                known = objective[_key(point)]
                if known["cpu"] != row["cpu"] or known["losses"] != row["losses"]:
                    raise SystemExit(f"{point}: trains otherwise than grid.jsonl's row: {row}")
                with RAW_TABLE.open("a") as out:
                    out.write(json.dumps({**row, "point": point}) + "\n")
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
