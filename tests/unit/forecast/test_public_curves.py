"""The forecast's law on curves no one here tuned to: a 124M-parameter model of Schaipp,
Hägele et al. (github.com/fabian-sp/lr-scheduling, MIT licence; the extract and its licence in
tests/data/public_curves, made by bench/public_curves.py). Fitted on the runs of at most 25k
steps (cosine to 10% at 15k and 25k, to 0 at 25k, the constant-LR runs up to 25k), it
forecasts the last measured loss of the cosine runs of 35k and 50k steps.

Measured: mean |error| 0.029 nats, at most 0.060, every forecast above the measured loss; the
issue's goal (0.005-0.01) is missed here as on our own curves. What the law must still do, and
this test holds it to: describe the curves it is fitted on, and know more about a longer run
than the same LR's shorter run does.
"""

import json
from pathlib import Path

import numpy as np

from schedule_search.core.schedules import ScheduleConfig
from schedule_search.forecast.law import Curve, Run, fit_law

EXTRACT = Path(__file__).resolve().parents[2] / "data" / "public_curves" / "schaipp_124m.json"
#: The longest run the law is fitted on, in units of 10,000 steps.
FITTED_UP_TO = 2.5


def load_runs() -> list[tuple[dict, Run, dict[float, float]]]:
    extract = json.loads(EXTRACT.read_text())
    assert "MIT License" in extract["licence"]
    return [
        (
            record,
            Run(record["lr"], ScheduleConfig(**record["schedule"])),
            {float(t): loss for t, loss in record["points"].items()},
        )
        for record in extract["runs"]
    ]


def test_the_law_forecasts_longer_cosine_runs_better_than_their_shorter_runs_do():
    runs = load_runs()
    fitted, held_out = [], []
    for record, run, points in runs:
        if record["schedule"]["kind"] == "constant":
            fitted.append(Curve(run, {t: v for t, v in points.items() if t <= FITTED_UP_TO}))
        elif record["schedule"]["horizon"] <= FITTED_UP_TO:
            fitted.append(Curve(run, points))
        else:
            held_out.append((record, run, points))
    assert len(fitted) == 14 and len(held_out) == 10
    law = fit_law(fitted)
    assert law.rmse < 0.03  # one law for 14 curves of 3 schedules and 4 LRs

    errors, naive = [], []
    for record, run, points in held_out:
        end = max(points)
        errors.append(float(law.predict(run, [end])[0]) - points[end])
        # What a user knows without the law: the same schedule and LR run to 25k steps.
        shorter = next(
            p
            for r, _, p in runs
            if r["schedule"] | {"horizon": 0} == record["schedule"] | {"horizon": 0}
            and r["lr"] == record["lr"]
            and r["schedule"]["horizon"] == FITTED_UP_TO
        )
        naive.append(shorter[max(shorter)] - points[end])
    print(
        f"forecast error: mean |e| {np.mean(np.abs(errors)):.4f}, max {np.max(np.abs(errors)):.4f}"
    )
    assert np.mean(np.abs(errors)) < 0.5 * np.mean(np.abs(naive))
    assert all(abs(e) < abs(n) for e, n in zip(errors, naive, strict=True))
