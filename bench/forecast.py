"""The forecast's law against the committed transfer study: fitted on sweep-protocol curves at
0.5x-4x only, its forecast of the recipe and of constant + EMA at 4x-32x beside the losses the
transfer measured (bench/results/tinylm-transfer/transfer.json), with the error per cell.

The curves: bench/results/family-search/grid.jsonl, the 45 AdamW points of the family grid
(LR x gamma x alpha on the default tinylm task, one rank, each the objective, the best EMA of
the bank, at 0.5x, 1x, 2x and 4x), the data and protocol of a sweep trial. The default sweep's
own records are not committed (runs/ is not in git), and a fresh `make sweep` has too few AdamW
evaluations for the law (ASHA stops most trials at 0.5x-1x: `forecast` refuses it). The grid
holds objective losses only, so the envelopes (last iterate) are not forecast here.

Usage: python bench/forecast.py   (about 2 minutes on 2 cores)
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from schedule_search.core.files import strict_json
from schedule_search.core.schedules import ScheduleConfig
from schedule_search.forecast.law import Curve, Run, fit_law
from schedule_search.forecast.predict import BOOTSTRAP

RESULTS = Path(__file__).resolve().parent / "results"
GRID = RESULTS / "family-search" / "grid.jsonl"
TRANSFER = RESULTS / "tinylm-transfer" / "transfer.json"
OUT = RESULTS / "forecast"
#: The recipe of the committed study (BENCHMARKS.md): trial 1ba94ede, 1 micro-batch per rank on
#: 2 workers, which the transfer (1 worker) ran as 2 micro-batches per step.
MICROBATCHES = 2


def grid_curves() -> list[Curve]:
    curves = []
    for line in GRID.read_text().splitlines():
        row = json.loads(line)
        point = row["point"]
        if point["family"] != "anytime":
            continue
        schedule = ScheduleConfig(
            kind="poly",
            warmup=0.4,
            gamma=point["anytime:schedule.gamma"],
            alpha=point["anytime:schedule.alpha"],
        )
        run = Run(point["anytime:optimizer.lr"], schedule, point["window.microbatches"])
        curves.append(Curve(run, {float(t): loss for t, loss in row["losses"].items()}))
    return curves


def measured_rows() -> dict[str, tuple[Run, dict[float, float]]]:
    """The recipe and constant + EMA runs of the transfer, each with its best EMA's loss (the
    grid's objective)."""
    table = json.loads(TRANSFER.read_text())
    rows = {}
    for name in ("recipe", "constant"):
        entry = table["runs"][name]
        schedule = ScheduleConfig(**{k: v for k, v in entry["schedule"].items() if k != "horizon"})
        losses = {  # null: not finite (the run diverged)
            float(h): math.nan if cell["best_ema"] is None else cell["best_ema"]
            for h, cell in entry["losses"].items()
        }
        rows[name] = (Run(entry["lr"], schedule, MICROBATCHES), losses)
    return rows


def main() -> None:
    curves = grid_curves()
    started = time.monotonic()
    law = fit_law(curves)
    rng = np.random.default_rng(0)
    refits = [
        fit_law([curves[i] for i in rng.integers(0, len(curves), len(curves))], start=law)
        for _ in range(BOOTSTRAP)
    ]
    seconds = time.monotonic() - started
    horizons = [4.0, 8.0, 16.0, 32.0]
    print(f"law on {len(curves)} curves ({seconds:.0f} s with {BOOTSTRAP} refits): {law}")
    cells = {}
    for name, (run, measured) in measured_rows().items():
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
        "law": law.__dict__,
        "cells": cells,
        "order": order,
    }
    (OUT / "forecast.json").write_text(strict_json(document))
    print(f"written: {OUT / 'forecast.json'}")


if __name__ == "__main__":
    main()
