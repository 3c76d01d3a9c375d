"""A transfer plan replayed on a finished transfer's recorded losses: the runs each round would
hold, their compute, and how long each round takes on parallel slots (longest first, as the
runner starts them), without training anything.

`transfer.seeds.pending_with_seeds` (the runner's own planning, replicas of every seed
included) is asked round by round and every run it asks for is answered with the
losses that run recorded (`transfer.json` keeps every run's loss at every horizon), so a
planning rule (where grids are centred, when they extend) is judged on real losses. A run the
recording lacks is listed as unrecorded and counted; nothing that depends on it is planned.

    python bench/transfer_replay.py bench/results/tinylm-transfer --slots 2 \
        --tokens-per-s 52000 --params 100096
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from schedule_search.core.config import parse
from schedule_search.train.config import TrainConfig
from schedule_search.train.evaluation import Evaluation
from schedule_search.transfer.plan import History, TransferStudy
from schedule_search.transfer.seeds import pending_with_seeds, seed_of, seeded


def number(value: float | None) -> float:
    """A loss as transfer.json holds it: null where it was not finite (a diverged run)."""
    return math.nan if value is None else value


def history(losses: dict[str, dict[str, float | None]]) -> History:
    """A recorded run's evaluations: its last iterate and its bank's best member."""
    out = []
    for horizon, row in losses.items():
        metrics: dict[str, Any] = {"chinchilla": float(horizon), "tokens": 0}
        metrics |= {
            "val_loss": number(row["objective"]),
            "val_loss_raw": number(row["last_iterate"]),
        }
        fraction = number(row["best_ema_fraction"])
        if math.isfinite(fraction) and fraction > 0:
            metrics[f"val_loss_ema/{fraction:g}"] = number(row["best_ema"])
        out.append(Evaluation.from_metrics(metrics))
    return out


def recorded_study(folder: Path) -> tuple[TransferStudy, int, dict[str, History]]:
    """The study a results folder was planned as (the recipe's optimizer, LR and schedule, its
    horizons and methods), its seeds, and every run's recorded evaluations."""
    launched = json.loads((folder / "launch.json").read_text())
    runs = json.loads((folder / "transfer.json").read_text())["runs"]
    recipe = runs["recipe"]
    sweep_horizon = next(h for h in launched["horizons"] if h not in launched["to"])
    base = {
        "optimizer": {"name": recipe["optimizer"] or "adamw", "lr": recipe["lr"]},
        "schedule": recipe["schedule"],
    }
    base["budget"] = {"horizon": sweep_horizon, "eval_at": []}
    study = TransferStudy(
        parse(TrainConfig, base, str(folder / "transfer.json")),
        launched["horizons"],
        launched["methods"],
        sweep_horizon,
        continue_from=launched.get("continued_from"),
    )
    recorded = {name: history(run["losses"]) for name, run in runs.items()}
    return study, launched.get("seeds", 1), recorded


def longest_slot(lengths: list[float], slots: int) -> float:
    """The round's length: runs started longest first, each on the slot that frees first."""
    busy = [0.0] * slots
    for length in sorted(lengths, reverse=True):
        heapq.heapreplace(busy, busy[0] + length)
    return max(busy)


def family(name: str) -> str:
    """The row a run's compute counts to (a seed's replica to its seed-0 run's row)."""
    name = seed_of(name)[0]
    return name.split("-", 1)[0] if not name.startswith("wsd-sqrt") else "wsd-sqrt"


def _replica_names(seeds: int, recorded: dict[str, History]) -> set[str]:
    """Every replica name a study of `seeds` seeds could plan over the recorded runs."""
    return {seeded(seed_of(name)[0], seed) for name in recorded for seed in range(1, seeds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "folder", type=Path, help="a transfer's results (transfer.json, launch.json)"
    )
    parser.add_argument("--slots", type=int, default=2, help="runs at once")
    parser.add_argument("--tokens-per-s", type=float, help="one slot's training rate")
    parser.add_argument("--params", type=int, help="the model's Chinchilla parameter count")
    parser.add_argument(
        "--seeds",
        type=int,
        help="plan this many seeds instead of the recorded study's (a replica the recording "
        "lacks is answered with its seed-0 run's losses: an estimate of a seeded rerun's cost)",
    )
    args = parser.parse_args()
    study, seeds, recorded = recorded_study(args.folder)
    if args.seeds:
        seeds = args.seeds
        recorded |= {
            name: recorded[seed_of(name)[0]]
            for name in _replica_names(seeds, recorded)
            if name not in recorded and seed_of(name)[0] in recorded
        }
    finished: dict[str, History] = {}
    unrecorded: set[str] = set()
    compute: dict[str, float] = defaultdict(float)
    total_length = 0.0

    def nowhere(run: str, multiple: float) -> Path:
        return Path(f"{run}@{multiple:g}x")  # the replay trains nothing

    for number in range(1, 100):
        pending = pending_with_seeds(study, seeds, finished, nowhere, frozenset(unrecorded))
        if not pending:
            break
        lengths = {name: study.length(config) for name, config in pending.items()}
        length = longest_slot(list(lengths.values()), args.slots)
        total_length += length
        missing = sorted(set(pending) - set(recorded))
        print(
            f"round {number}: {len(pending)} runs, {sum(lengths.values()):g}x, longest slot "
            f"{length:g}x" + (f"; unrecorded: {', '.join(missing)}" if missing else "")
        )
        for name in pending:
            compute[family(name)] += lengths[name]
            if name in recorded:
                finished[name] = recorded[name]
        unrecorded |= set(missing)
    print("compute per row (Chinchilla multiples):", {k: round(v, 6) for k, v in compute.items()})
    print(f"total {sum(compute.values()):g}x; rounds' longest slots add up to {total_length:g}x")
    if args.tokens_per_s and args.params:
        minutes = (
            total_length * study.base.budget.tokens_per_param * args.params / args.tokens_per_s / 60
        )
        print(f"at {args.tokens_per_s:,.0f} tokens/s a slot: {minutes:.0f} min of training")


if __name__ == "__main__":
    main()
