"""The forecast's law against the committed transfer study: fitted on sweep-protocol curves at
0.5x-4x only, its forecast of the recipe and of constant + EMA at 4x-32x beside the losses the
transfer measured (bench/results/tinylm-transfer/transfer.json), with the error per cell.

The curves: bench/results/family-search/grid.jsonl, the 90 points of the family grid on the
default tinylm task, one rank, each the objective (the best EMA of the bank) at 0.5x, 1x, 2x
and 4x: the data and protocol of a sweep trial. 45 AdamW points (LR x gamma x alpha) and 45
schedule-free ones (LR x warmup x beta 1); one law is fitted per optimizer, and each row is
forecast by the law of the optimizer its run trained with (a schedule-free recipe by the
schedule-free law, constant + EMA by AdamW's), as `schedule-search forecast` does. The
default sweep's own records are not committed (runs/ is not in git), and a fresh
`make sweep` has too few evaluations for the law (ASHA stops most trials at 0.5x-1x:
`forecast` refuses it). The grid holds objective losses only, so the envelopes (last iterate)
are not forecast here.

Usage: python bench/forecast.py   (about 2 minutes per law on 2 cores)
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from schedule_search.core.files import strict_json
from schedule_search.core.schedules import ScheduleConfig
from schedule_search.forecast.law import Curve, LossLaw, Run, fit_law
from schedule_search.forecast.predict import BOOTSTRAP

RESULTS = Path(__file__).resolve().parent / "results"
GRID = RESULTS / "family-search" / "grid.jsonl"
TRANSFER = RESULTS / "tinylm-transfer" / "transfer.json"
OUT = RESULTS / "forecast"
#: Micro-batches per step of the transfer's runs: the recipes of the committed studies (trial
#: 1ba94ede, then 960eb000) ran 1 micro-batch on each of 2 sweep workers, which the transfer
#: (1 worker) runs as 2 micro-batches per step: the same tokens per step.
MICROBATCHES = 2
#: The grid's family of each optimizer a transfer run names.
FAMILY_OF = {"adamw": "anytime", "schedulefree_adamw": "schedulefree"}


def grid_curves(family: str) -> list[Curve]:
    """The grid's curves of one family, each as the run a sweep trial of it would be."""
    curves = []
    for line in GRID.read_text().splitlines():
        row = json.loads(line)
        point = row["point"]
        if point["family"] != family:
            continue
        if family == "anytime":
            schedule = ScheduleConfig(
                kind="poly",
                warmup=0.4,
                gamma=point["anytime:schedule.gamma"],
                alpha=point["anytime:schedule.alpha"],
            )
        else:  # schedule-free: a constant LR after its warmup
            schedule = ScheduleConfig(kind="constant", warmup=point["schedulefree:schedule.warmup"])
        run = Run(point[f"{family}:optimizer.lr"], schedule, point["window.microbatches"])
        curves.append(Curve(run, {float(t): loss for t, loss in row["losses"].items()}))
    return curves


def measured_rows() -> dict[str, tuple[str, Run, dict[float, float]]]:
    """The recipe and constant + EMA runs of the transfer, each with the optimizer it trained
    with and its best EMA's loss (the grid's objective)."""
    table = json.loads(TRANSFER.read_text())
    rows = {}
    for name in ("recipe", "constant"):
        entry = table["runs"][name]
        schedule = ScheduleConfig(**{k: v for k, v in entry["schedule"].items() if k != "horizon"})
        losses = {  # null: not finite (the run diverged)
            float(h): math.nan if cell["best_ema"] is None else cell["best_ema"]
            for h, cell in entry["losses"].items()
        }
        run = Run(entry["lr"], schedule, MICROBATCHES)
        rows[name] = (entry["optimizer"] or "adamw", run, losses)
    return rows


def fitted(curves: list[Curve]) -> tuple[LossLaw, list[LossLaw]]:
    """The law on `curves` and its refits on curves drawn with replacement (the interval)."""
    law = fit_law(curves)
    rng = np.random.default_rng(0)
    refits = [
        fit_law([curves[i] for i in rng.integers(0, len(curves), len(curves))], start=law)
        for _ in range(BOOTSTRAP)
    ]
    return law, refits


def main() -> None:
    rows = measured_rows()
    laws = {}
    for optimizer in sorted({optimizer for optimizer, _, _ in rows.values()}):
        curves = grid_curves(FAMILY_OF[optimizer])
        started = time.monotonic()
        laws[optimizer] = fitted(curves)
        seconds = time.monotonic() - started
        print(f"{optimizer} law on {len(curves)} curves ({seconds:.0f} s with {BOOTSTRAP} refits):")
        print(f"  {laws[optimizer][0]}")
    horizons = [4.0, 8.0, 16.0, 32.0]
    cells = {}
    for name, (optimizer, run, measured) in rows.items():
        law, refits = laws[optimizer]
        forecast = law.predict(run, horizons)
        spread = np.array([refit.predict(run, horizons) for refit in refits])
        low, high = np.percentile(spread, [10, 90], axis=0)
        for h, value, lo, hi in zip(horizons, forecast, low, high, strict=True):
            actual = measured.get(h)
            error = None if actual is None else float(value) - actual
            cells.setdefault(name, {})[f"{h:g}"] = {
                "forecast": float(value),
                "low": float(lo),
                "high": float(hi),
                "measured": actual,
                "error": error,
                "inside": None if actual is None else bool(lo <= actual <= hi),
            }
            shown = "-" if actual is None else f"{actual:.4f} (error {error:+.4f})"
            print(f"{name:9s} {h:>4g}x forecast {value:.4f} [{lo:.4f}, {hi:.4f}]  measured {shown}")
    order = {
        f"{h:g}": {
            "forecast": sorted(cells, key=lambda n, k=f"{h:g}": cells[n][k]["forecast"]),
            "measured": sorted(cells, key=lambda n, k=f"{h:g}": cells[n][k]["measured"] or 0),
        }
        for h in horizons[1:]
    }
    OUT.mkdir(parents=True, exist_ok=True)
    document = {
        "curves": str(GRID.relative_to(RESULTS.parent.parent)),
        "measured": str(TRANSFER.relative_to(RESULTS.parent.parent)),
        "laws": {optimizer: law.__dict__ for optimizer, (law, _) in laws.items()},
        "cells": cells,
        "order": order,
    }
    (OUT / "forecast.json").write_text(strict_json(document))
    print(f"written: {OUT / 'forecast.json'}")


if __name__ == "__main__":
    main()
