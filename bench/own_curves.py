"""Every completed trial of a sweep continued along its own curve to 8x-32x, written down before
a transfer measures any of them: which trial the own curve says is best at each horizon, and
whether that is the trial the sweep picked at 4x.

The own curve (`schedule_search.forecast.own_curve`: L = E + A t^-alpha on the objective's
evaluations after the warmup) forecast the committed study's schedule-free recipe within
0.0021 nats at 8x-32x (BENCHMARKS.md, "Forecast"). `forecast` uses it for the recipe only
where the trial evaluated 4 times past its warmup. A sweep without the default's 3x evaluation
(before f1626b3) leaves a trial warmed up past 0.5x three (1x, 2x, 4x), through which the curve
passes exactly: such forecasts are listed with no interval and marked, to be checked against
what the transfer then measures.

The sweep's records are not in git (runs/): the output holds each trial's config and
evaluations, so the table can be read and checked without them.

Usage: python bench/own_curves.py [SWEEP_FOLDER]   (default runs/default; seconds)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from schedule_search.core.files import strict_json
from schedule_search.forecast.own_curve import (
    MIN_OWN_POINTS,
    continue_curve,
    fit_power_curve,
    past_warmup,
)
from schedule_search.store.experiment import Experiment
from schedule_search.store.facts import read_facts
from schedule_search.store.records import read_records

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench" / "results" / "forecast" / "own_curves.json"
HORIZONS = (8.0, 16.0, 32.0)
#: Fewest evaluations past the warmup to draw a curve at all (it then passes through them).
FEWEST = 3


def trial_rows(experiment: Experiment, horizon: float) -> list[dict]:
    """Each trial that reached `horizon` (the sweep's): its config, evaluations and forecasts."""
    rows = []
    for trial_id in experiment.trial_ids():
        records = read_records(experiment.trial_dir(trial_id))
        if records.problem or not records.history:
            continue
        config = records.config["config"]
        objective = {e.chinchilla: e.val_loss for e in records.history}
        points = past_warmup(objective, config["schedule"]["warmup"])
        if horizon not in objective or len(points) < FEWEST:
            continue
        rows.append(
            {
                "trial": trial_id,
                "optimizer": config["optimizer"]["name"],
                "lr": config["optimizer"]["lr"],
                "schedule": config["schedule"],
                "objective": {f"{t:g}": loss for t, loss in sorted(objective.items())},
                "fitted_on": sorted(points),
                "forecast": {f"{h:g}": _forecast(points, h) for h in HORIZONS},
            }
        )
    return rows


def _forecast(points: dict[float, float], horizon: float) -> dict:
    if len(points) >= MIN_OWN_POINTS:
        loss, low, high = continue_curve(points, horizon)
        return {"loss": loss, "low": low, "high": high, "exact_through_its_points": False}
    loss = float(fit_power_curve(points).predict([horizon])[0])
    return {"loss": loss, "low": None, "high": None, "exact_through_its_points": True}


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "runs" / "default"
    experiment = Experiment(folder)
    horizon = read_facts(folder).horizon
    at = f"{horizon:g}"
    rows = sorted(trial_rows(experiment, horizon), key=lambda r: r["objective"][at])
    if not rows:
        raise SystemExit(f"{folder}: no trial reached {at}x with {FEWEST} evaluations past warmup")
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(f"{'trial':10s} {'optimizer':20s} {'lr':>8s} {'warmup':>6s}   {at}x measured", end="")
    print("".join(f"   {h:g}x forecast [interval]" for h in HORIZONS))
    for row in rows:
        cells = []
        for h in HORIZONS:
            cell = row["forecast"][f"{h:g}"]
            shown = "exact" if cell["low"] is None else f"{cell['low']:.4f}, {cell['high']:.4f}"
            cells.append(f"   {cell['loss']:.4f} [{shown}]")
        head = f"{row['trial']:10s} {row['optimizer']:20s} {row['lr']:8.2e} "
        print(head + f"{row['schedule']['warmup']:6.2f}   {row['objective'][at]:.4f}", end="")
        print("".join(cells))
    for h in HORIZONS:
        best = min(rows, key=lambda r, k=f"{h:g}": r["forecast"][k]["loss"])
        print(f"best at {h:g}x by its own curve: {best['trial']} (at {at}x: {rows[0]['trial']})")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(strict_json({"sweep": folder.name, "commit": commit, "trials": rows}) + "\n")
    print(f"written: {OUT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
