"""A transfer plan replayed on a finished transfer's recorded losses: the runs each round would
hold, their compute, and how long each round takes on parallel slots (longest first, as the
runner starts them), without training anything.

`transfer.seeds.pending_with_seeds` (the runner's own planning, replicas of every seed
included) is asked round by round and every run it asks for is answered with the
losses that run recorded (`transfer.json` keeps every run's loss at every horizon), so a
planning rule (where grids are centred, when they extend) is judged on real losses. A run the
recording lacks is listed as unrecorded and counted; nothing that depends on it is planned.

`--centres FORECAST_JSON` replays issue 30's rule instead of the study's own: each envelope
grid centred on the forecast's best LR for its kind and horizon (`forecast.json`'s envelope
cells; `--fitted-only`: only the cells whose LR lies inside the LRs the law was fitted on, the
others centred as the study does). The centre is snapped to the nearest LR of the study's own
x2 lattice (the recipe's AdamW LR times a power of 2), so runs the study also ran are answered
with their recorded losses. A grid point the recording lacks (an LR past the recorded runs of
its grid) is answered as the worst run of its grid: the assumption that the loss keeps rising
past the LRs measured (every grid of the recorded study ended with its best interior); its
compute is counted all the same. So the replay says what centring costs, and whether, on that
assumption, it would change an envelope.

    python bench/transfer_replay.py bench/results/tinylm-transfer --slots 2 \
        --tokens-per-s 52000 --params 100096
    python bench/transfer_replay.py bench/results/tinylm-transfer \
        --centres bench/results/forecast/forecast.json [--fitted-only]
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedule_search.core.config import parse
from schedule_search.train.config import TrainConfig
from schedule_search.train.evaluation import Evaluation
from schedule_search.transfer.lr_grid import GRID, GridSpec, canonical, rank
from schedule_search.transfer.plan import TransferStudy, constant_lr_of
from schedule_search.transfer.scores import History
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
        constant_lr=constant_lr_of(folder / "launch.json"),
    )
    recorded = {name: history(run["losses"]) for name, run in runs.items()}
    return study, launched.get("seeds", 1), recorded


#: forecast.json's envelope rows -> the transfer's grid kinds.
FORECAST_ROWS = {
    "cosine envelope (last iterate)": "cosine",
    "linear-to-zero envelope (last iterate)": "linear",
}


@dataclass
class CentredOnForecast(TransferStudy):
    """The study with the envelope grids in `centres` ((kind, horizon) -> LR) centred there;
    every other grid as the study centres it, on the grids actually run at the horizon before
    (`TransferStudy.centre`'s rule, which these grids' runs then feed)."""

    centres: dict[tuple[str, float], float] = field(default_factory=dict)

    def grid(self, kind: str, horizon: float, finished: dict[str, History]) -> GridSpec | None:
        centre = self.centres.get((kind, horizon))
        if centre is None:
            return super().grid(kind, horizon, finished)
        return GridSpec(kind, horizon, tuple(centre * f for f in GRID))

    def centre(self, horizon: float, finished: dict[str, History]) -> float | None:
        shorter = [h for h in self.horizons if h < horizon]
        if not shorter:
            return self.adamw_lr
        anchors = [self.grid(kind, shorter[-1], finished) for kind in self.envelope_kinds]
        if any(a is None or a.to_run(finished) for a in anchors):
            return None
        # LRs agreeing to 4 digits are one LR: a grid centred here and one centred as the
        # study centres it reach the same lattice point by paths that differ in the 6th digit.
        runs = [a.losses(finished) for a in anchors if a is not None]
        exact = {float(f"{lr:.4g}"): lr for lr in runs[0]}
        losses = [{float(f"{lr:.4g}"): loss for lr, loss in r.items()} for r in runs]
        shared = set.intersection(*(set(by_lr) for by_lr in losses))
        best = min(shared, key=lambda lr: (sum(rank(by_lr[lr]) for by_lr in losses), lr))
        return exact[best]


def forecast_centres(
    path: Path, study: TransferStudy, recorded: dict[str, History], fitted_only: bool
) -> dict[tuple[str, float], float]:
    """(kind, horizon) -> the forecast's best LR snapped to the study's x2 lattice: a
    recorded run's LR of that grid where one is that lattice point, so names agree."""
    cells = json.loads(path.read_text())["cells"]
    centres = {}
    for row, kind in FORECAST_ROWS.items():
        for horizon, cell in cells[row].items():
            if fitted_only and cell.get("caution"):
                continue
            steps = round(math.log2(cell["lr"] / study.adamw_lr))
            lattice = study.adamw_lr * 2.0**steps
            spec = GridSpec(kind, float(horizon), ())
            ran = [lr for name in recorded if (lr := spec.lr_of(name)) is not None]
            near = [lr for lr in ran if math.isclose(lr, lattice, rel_tol=1e-5)]
            centres[(kind, float(horizon))] = near[0] if near else canonical(lattice)
    return centres


def recorded_as(name: str, recorded: dict[str, History]) -> str | None:
    """The recorded run `name` stands for: itself, or a run of the same grid and seed whose LR
    agrees to 1e-5 (a centre reached by another path can differ in its 6th digit)."""
    if name in recorded:
        return name
    base, seed = seed_of(name)
    prefix, mark, lr = base.rpartition("-lr")
    if not mark:
        return None
    for other in recorded:
        other_base, other_seed = seed_of(other)
        other_prefix, _, other_lr = other_base.rpartition("-lr")
        if (other_prefix, other_seed) == (prefix, seed) and math.isclose(
            float(lr), float(other_lr), rel_tol=1e-5
        ):
            return other
    return None


def worst_of_grid(name: str) -> History:
    """An unrecorded envelope run answered as its grid's worst: no finite loss at its
    horizon (`lr_grid.rank` puts it last)."""
    horizon = float(name.split("-")[1].removesuffix("x"))
    metrics = {"chinchilla": horizon, "tokens": 0, "val_loss": math.inf}
    return [Evaluation.from_metrics(metrics | {"val_loss_raw": math.inf})]


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


def replay(
    study: TransferStudy, seeds: int, recorded: dict[str, History], slots: int, answer_worst: bool
) -> tuple[dict[str, History], dict[str, float], float]:
    """Round by round: every finished run's history, the compute per row and the sum of the
    rounds' longest slots. With `answer_worst`, an unrecorded seed-0 envelope run is answered
    as its grid's worst (`worst_of_grid`); any other unrecorded run is left unfinished."""
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
        length = longest_slot(list(lengths.values()), slots)
        total_length += length
        missing = sorted(n for n in pending if recorded_as(n, recorded) is None)
        worst = [n for n in missing if answer_worst and family(n) in study.envelope_kinds]
        worst = [n for n in worst if seed_of(n)[1] == 0]
        print(
            f"round {number}: {len(pending)} runs, {sum(lengths.values()):g}x, longest slot "
            f"{length:g}x" + (f"; unrecorded: {', '.join(missing)}" if missing else "")
        )
        for name in pending:
            compute[family(name)] += lengths[name]
            if (known := recorded_as(name, recorded)) is not None:
                finished[name] = recorded[known]
            elif name in worst:
                finished[name] = worst_of_grid(name)
        unrecorded |= set(missing) - set(worst)
    return finished, compute, total_length


def print_envelopes(study: TransferStudy, finished: dict[str, History]) -> None:
    """Each envelope grid's LRs run, its best LR and loss (last iterate), and whether the best
    is interior: what a planning rule must not change."""
    for kind in study.envelope_kinds:
        for horizon in study.horizons:
            spec = study.grid(kind, horizon, finished)
            if spec is None:
                print(f"{kind} {horizon:g}x: not planned")
                continue
            state, losses = spec.state(finished), spec.losses(finished)
            ran = ", ".join(f"{lr:.3g}" for lr in sorted(losses))
            best = state.best_lr
            shown = "-" if best is None else f"{best:.3g} ({losses[best]:.4f})"
            where = "interior" if state.interior else f"at an edge ({state.bound_hit or 'open'})"
            print(f"{kind} {horizon:g}x: ran {ran}; best {shown}, {where}")


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
    parser.add_argument(
        "--centres", type=Path, help="a forecast.json: centre the envelope grids on its LRs"
    )
    parser.add_argument(
        "--fitted-only",
        action="store_true",
        help="with --centres: only the cells whose LR lies inside the law's fitted LRs",
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
    if args.centres:
        centres = forecast_centres(args.centres, study, recorded, args.fitted_only)
        print("centres:", {f"{k} {h:g}x": f"{lr:.3g}" for (k, h), lr in centres.items()})
        study = CentredOnForecast(
            study.base,
            study.horizons,
            study.methods,
            study.sweep_horizon,
            continue_from=study.continue_from,
            constant_lr=study.constant_lr,
            centres=centres,
        )
    finished, compute, total_length = replay(
        study, seeds, recorded, args.slots, answer_worst=bool(args.centres)
    )
    print_envelopes(study, finished)
    print("compute per row (Chinchilla multiples):", {k: round(v, 6) for k, v in compute.items()})
    envelope = sum(compute[kind] for kind in study.envelope_kinds)
    print(f"envelope grids: {envelope:g}x")
    print(f"total {sum(compute.values()):g}x; rounds' longest slots add up to {total_length:g}x")
    if args.tokens_per_s and args.params:
        minutes = (
            total_length * study.base.budget.tokens_per_param * args.params / args.tokens_per_s / 60
        )
        print(f"at {args.tokens_per_s:,.0f} tokens/s a slot: {minutes:.0f} min of training")


if __name__ == "__main__":
    main()
