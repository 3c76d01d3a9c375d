"""The forecast against the committed transfer study: fitted on sweep-protocol curves at
0.5x-4x only, its forecast of the recipe, constant + EMA and the two envelopes at 4x-32x beside
the losses the transfer measured (bench/results/tinylm-transfer/transfer.json), with the error
per cell.

The curves: bench/results/family-search/grid.jsonl, the 90 points of the family grid on the
default tinylm task, one rank, each the objective (the best EMA of the bank) at 0.5x, 1x, 2x
and 4x: the data and protocol of a sweep trial. As `schedule-search forecast` does, the recipe
is continued along its own curve (`forecast.own_curve`; the grid's row of the recipe's config,
which a sweep trial of it scores bit for bit) and constant + EMA is forecast by the law fitted
on the 45 AdamW points (LR x gamma x alpha); the law fitted on the 45 schedule-free points
(LR x warmup x beta 1) is reported beside it, for the recipe, as what the forecast did before.
The default sweep's own records are not committed (runs/ is not in git), and a fresh
`make sweep` has too few evaluations for the AdamW law (ASHA stops most trials at 0.5x-1x:
`forecast` refuses it). The envelopes (scored by their last iterate) are forecast by the AdamW
law fitted on the same 45 points' raw weights' losses (`RAW_GRID`, from `bench/raw_grid.py`),
each horizon at the law's best LR, as the verb does.

A second table checks the own curve on every horizon-free run of the study that measured its
own curve to 4x (constant + EMA and the recipe, every seed): fitted on its evaluations after
its warmup up to 4x, read at 8x-32x.

Usage: python bench/forecast.py   (about 40 s)
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from schedule_search.core.files import strict_json
from schedule_search.core.schedules import ScheduleConfig
from schedule_search.forecast.law import Curve, Run
from schedule_search.forecast.own_curve import MIN_OWN_POINTS, continue_curve, past_warmup
from schedule_search.forecast.predict import (
    BOOTSTRAP,
    ENVELOPES,
    LawFit,
    envelope_cells,
    fit_group,
    law_cells,
)

RESULTS = Path(__file__).resolve().parent / "results"
GRID = RESULTS / "family-search" / "grid.jsonl"
#: The AdamW points again with their raw weights' losses (`python bench/raw_grid.py`).
RAW_GRID = RESULTS / "family-search" / "raw.jsonl"
TRANSFER = RESULTS / "tinylm-transfer" / "transfer.json"
OUT = RESULTS / "forecast"
#: Micro-batches per step of the transfer's runs: the recipes of the committed studies (trial
#: 1ba94ede, then 960eb000) ran 1 micro-batch on each of 2 sweep workers, which the transfer
#: (1 worker) runs as 2 micro-batches per step: the same tokens per step.
MICROBATCHES = 2
#: The grid's family of each optimizer a transfer run names.
FAMILY_OF = {"adamw": "anytime", "schedulefree_adamw": "schedulefree"}


def grid_curves(family: str, table: Path = GRID, measure: str = "losses") -> list[Curve]:
    """The grid's curves of one family, each as the run a sweep trial of it would be: its
    objective ("losses") or, from `RAW_GRID`, its raw weights' losses ("raw")."""
    curves = []
    for line in table.read_text().splitlines():
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
        curves.append(Curve(run, {float(t): loss for t, loss in row[measure].items()}))
    return curves


#: The recipe's beta 1: trial 960eb000 is schedule-free's seeded point of the default space
#: (LR 9.5e-3, warmup 0.4x, beta 1 0.9; BENCHMARKS.md), which `transfer.json` does not record.
RECIPE_BETA1 = 0.9
HORIZONS = [4.0, 8.0, 16.0, 32.0]


def transfer_runs() -> dict[str, dict]:
    return json.loads(TRANSFER.read_text())["runs"]


def best_ema(entry: dict) -> dict[float, float]:
    """A transfer run's best EMA at each horizon it measured (null, not finite: NaN)."""
    return {
        float(h): math.nan if cell["best_ema"] is None else cell["best_ema"]
        for h, cell in entry["losses"].items()
    }


def as_run(entry: dict) -> Run:
    schedule = ScheduleConfig(**{k: v for k, v in entry["schedule"].items() if k != "horizon"})
    return Run(entry["lr"], schedule, MICROBATCHES)


def recipe_grid_curve(run: Run) -> dict[float, float]:
    """The grid's objective curve of the recipe's config: what the sweep's trial measured."""
    for line in GRID.read_text().splitlines():
        row = json.loads(line)
        point = row["point"]
        if (
            point["family"] == "schedulefree"
            and math.isclose(point["schedulefree:optimizer.lr"], run.lr)
            and point["schedulefree:schedule.warmup"] == run.schedule.warmup
            and point["schedulefree:optimizer.betas.0"] == RECIPE_BETA1
        ):
            return {float(t): loss for t, loss in row["losses"].items()}
    raise SystemExit(f"{GRID}: no row of the recipe's config ({run})")


def fitted(curves: list[Curve], what: str) -> LawFit:
    started = time.monotonic()
    fit = fit_group(curves, what)
    seconds = time.monotonic() - started
    print(f"{what} law on {len(curves)} curves ({seconds:.0f} s with {BOOTSTRAP} refits):")
    print(f"  {fit.law}")
    return fit


def as_triples(cells: dict) -> list[tuple[float, float, float]]:
    return [(cells[h].loss, cells[h].low, cells[h].high) for h in HORIZONS]


def own_cells(curve: dict[float, float], warmup: float) -> list[tuple[float, float, float]]:
    points = past_warmup({t: v for t, v in curve.items() if t <= 4.0}, warmup)
    assert len(points) >= MIN_OWN_POINTS, points
    return [continue_curve(points, h) for h in HORIZONS]


def compared(
    name: str, predicted: list[tuple[float, float, float]], measured: dict[float, float]
) -> dict[str, dict]:
    """Each horizon's forecast, interval, measured loss and error, printed as it goes."""
    cells = {}
    for h, (value, low, high) in zip(HORIZONS, predicted, strict=True):
        actual = measured.get(h)
        error = None if actual is None else value - actual
        cells[f"{h:g}"] = {
            "forecast": value,
            "low": low,
            "high": high,
            "measured": actual,
            "error": error,
            "inside": None if actual is None else bool(low <= actual <= high),
        }
        shown = "-" if actual is None else f"{actual:.4f} (error {error:+.4f})"
        print(f"{name:34s} {h:>4g}x {value:.4f} [{low:.4f}, {high:.4f}]  measured {shown}")
    return cells


def main() -> None:
    runs, rows = transfer_runs(), json.loads(TRANSFER.read_text())["rows"]
    laws = {
        optimizer: fitted(grid_curves(family), f"{optimizer} (objective)")
        for optimizer, family in FAMILY_OF.items()
    }
    recipe, constant = runs["recipe"], runs["constant"]
    recipe_curve = recipe_grid_curve(as_run(recipe))
    measured_recipe = {**recipe_curve, **best_ema(recipe)}
    cells = {
        "recipe": compared(
            "recipe (own curve)",
            own_cells(recipe_curve, recipe["schedule"]["warmup"]),
            measured_recipe,
        ),
        "constant": compared(
            "constant + EMA (AdamW law)",
            as_triples(law_cells(laws["adamw"], as_run(constant), HORIZONS)),
            best_ema(constant),
        ),
    }
    if RAW_GRID.exists():  # the envelopes, by AdamW's law on the raw weights' losses
        raw = fitted(grid_curves("anytime", RAW_GRID, "raw"), "adamw (raw)")
        laws["adamw (raw)"] = raw
        envelopes = envelope_cells(raw, as_run(recipe), HORIZONS)
        for label in ENVELOPES:
            measured = {float(h): loss for h, loss in rows[label]["loss"].items()}
            cells[label] = compared(label, as_triples(envelopes[label]), measured)
            for h in HORIZONS:
                cell = envelopes[label][h]
                cells[label][f"{h:g}"].update(lr=cell.lr, caution=cell.caution)
    before = compared(
        "recipe (schedule-free law, before)",
        as_triples(law_cells(laws["schedulefree_adamw"], as_run(recipe), HORIZONS)),
        measured_recipe,
    )
    order = {
        f"{h:g}": {
            "forecast": sorted(cells, key=lambda n, k=f"{h:g}": cells[n][k]["forecast"]),
            "measured": sorted(cells, key=lambda n, k=f"{h:g}": cells[n][k]["measured"] or 0),
        }
        for h in HORIZONS[1:]
    }
    # The own curve on every horizon-free run that measured its own curve to 4x.
    print("\nown curve on every horizon-free run of the study:")
    check = {"recipe": cells["recipe"]}
    for name, entry in runs.items():
        losses = best_ema(entry)
        if entry["schedule"]["horizon"] is None and min(losses) < 4.0 and max(losses) >= 32.0:
            check[name] = compared(name, own_cells(losses, entry["schedule"]["warmup"]), losses)
    OUT.mkdir(parents=True, exist_ok=True)
    document = {
        "curves": str(GRID.relative_to(RESULTS.parent.parent)),
        "measured": str(TRANSFER.relative_to(RESULTS.parent.parent)),
        "recipe": "its own curve continued (the grid's row of its config, 0.5x-4x)",
        "constant": "the AdamW law fitted on the grid's 45 AdamW curves (objective)",
        "envelopes": "the AdamW law fitted on the same points' raw losses (raw.jsonl), "
        "each horizon at the law's best LR",
        "laws": {name: fit.law.__dict__ for name, fit in laws.items()},
        "cells": cells,
        "order": order,
        "recipe_by_the_schedule_free_law": before,
        "own_curve_on_every_horizon_free_run": check,
    }
    (OUT / "forecast.json").write_text(strict_json(document))
    print(f"written: {OUT / 'forecast.json'}")


if __name__ == "__main__":
    main()
