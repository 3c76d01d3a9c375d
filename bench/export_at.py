"""`export --at H` against the sweep's own pick, measured: the trial whose own curve forecasts the
lowest loss at H and the trial best at the sweep's horizon, each trained to 32x on the same
seeds, paired by seed (mean and 95% Student-t interval of pick-at-H minus pick-at-4x).

The runs are made with the product's own verbs; this script only reads their records:

    schedule-search export SWEEP --at 32             # the pick at 32x: SWEEP/recipe.yaml
    schedule-search transfer SWEEP --methods recipe --to 8,16,32 --workers 1 --concurrency 1
                                                     # seed 0, continued from its 4x checkpoint
    schedule-search train SEEDk.yaml --workers 1 --run-dir DIR   # seeds 1, 2: the transfer's
                                                     # recipe config with `seed: k` and
                                                     # `branch_from: null`, as `--seeds` trains

Usage: python bench/export_at.py --recipe SWEEP/recipe.yaml --at-pick M0 M1 M2 \\
           --four-x-pick N0 N1 N2 [--out FILE]  (metrics.json files, seed 0 first; seconds)

`export --at 32 --within 0.012` is measured the same way, its three seeds made at once by
`schedule-search transfer SWEEP --methods recipe --to 8,16,32 --seeds 3` (export_within.json).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import yaml
from scipy.stats import t as student_t

from schedule_search.core.files import strict_json

OUT = Path(__file__).resolve().parent / "results" / "forecast" / "export_at.json"
HORIZONS = (8.0, 16.0, 32.0)


def losses(metrics: Path) -> dict[float, float]:
    """The objective (the recipe's EMA fraction) at each evaluation of a run."""
    return {row["chinchilla"]: row["val_loss"] for row in json.loads(metrics.read_text())}


def paired(a: list[float], b: list[float]) -> dict[str, float | list[float]]:
    differences = [x - y for x, y in zip(a, b, strict=True)]
    mean = statistics.fmean(differences)
    n = len(differences)
    half = student_t.ppf(0.975, n - 1) * statistics.stdev(differences) / math.sqrt(n)
    return {"differences": differences, "mean": mean, "half_width": half}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", type=Path, required=True, help="the --at export")
    parser.add_argument("--at-pick", type=Path, nargs="+", required=True)
    parser.add_argument("--four-x-pick", type=Path, nargs="+", required=True)
    parser.add_argument("--out", type=Path, default=OUT, help=f"default: {OUT.name}")
    args = parser.parse_args()
    recipe = yaml.safe_load(args.recipe.read_text())
    forecast = recipe["objective"]["forecast"]
    at_pick = [losses(m) for m in args.at_pick]
    four_x_pick = [losses(m) for m in args.four_x_pick]
    rows = {}
    for h in HORIZONS:
        at, four = [r[h] for r in at_pick], [r[h] for r in four_x_pick]
        rows[f"{h:g}"] = {"at_pick": at, "four_x_pick": four, "at_minus_four_x": paired(at, four)}
        gap = rows[f"{h:g}"]["at_minus_four_x"]
        verdict = "" if abs(gap["mean"]) <= gap["half_width"] else " (interval excludes 0)"
        print(
            f"{h:>4g}x  pick at H {statistics.fmean(at):.4f}  pick at 4x "
            f"{statistics.fmean(four):.4f}  difference {gap['mean']:+.4f} ± "
            f"{gap['half_width']:.4f}{verdict}"
        )
    print(
        f"forecast of trial {forecast['trial_id']} at {forecast['horizon']:g}x: "
        f"{forecast['loss']:.4f} [{forecast['low']:.4f}, {forecast['high']:.4f}]; seed 0 measured "
        f"{at_pick[0][forecast['horizon']]:.4f}"
    )
    args.out.write_text(strict_json({"forecast": forecast, "horizons": rows}) + "\n")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
