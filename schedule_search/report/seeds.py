"""The transfer table over seeds: each cell a mean with a 95% interval, each gap to the envelope
paired seed by seed, and a gap called better or worse only where its interval excludes 0.

Seed k of every row is scored on the same held-out sample (the task draws it from the seed),
so the gap of seed k is the difference of two runs evaluated alike; the interval of the mean
gap is Student's t over the K paired differences (K - 1 degrees of freedom). A row's seed-k
loss comes from the replica of the run its seed-0 loss came from (`row["source"]`); a cell
whose replica is missing counts the seeds it has (`n`).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from scipy import stats

from schedule_search.transfer.plan import History, loss_at
from schedule_search.transfer.seeds import seeded

__all__ = ["CONFIDENCE", "add_seed_statistics", "interval", "seeds_markdown", "verdict"]

CONFIDENCE = 0.95


def interval(values: list[float]) -> tuple[float, float, int]:
    """(mean, half-width of its 95% t-interval, n) of the finite values; the half-width is NaN
    for fewer than two."""
    finite = [v for v in values if math.isfinite(v)]
    n = len(finite)
    if n == 0:
        return math.nan, math.nan, 0
    mean = statistics.fmean(finite)
    if n == 1:
        return mean, math.nan, 1
    t = float(stats.t.ppf((1 + CONFIDENCE) / 2, n - 1))
    return mean, t * statistics.stdev(finite) / math.sqrt(n), n


def verdict(mean: float, half_width: float) -> str:
    """How a gap (row minus envelope) reads: better or worse only where its interval excludes
    0; otherwise within the noise of the seeds."""
    if not (math.isfinite(mean) and math.isfinite(half_width)):
        return "n/a"
    if mean + half_width < 0:
        return "better"
    if mean - half_width > 0:
        return "worse"
    return "within noise"


def _seed_losses(row: dict[str, Any], runs: dict[str, History], seeds: int, h: float) -> list:
    name, score = row["source"].get(h, (None, "last"))
    losses = [row["loss"][h]]
    for seed in range(1, seeds):
        replica = runs.get(seeded(name, seed)) if name else None
        losses.append(loss_at(replica, h, score) if replica else math.nan)
    return losses


def add_seed_statistics(
    rows: dict[str, dict[str, Any]],
    runs: dict[str, History],
    seeds: int,
    horizons: list[float],
    envelope: str | None,
) -> None:
    """Give each row with replicas (a `source`) `seeds[h]`: every seed's loss, their mean and
    interval, and the gap to the row `envelope` paired by seed (NaN without one), its interval
    and its verdict."""
    missing = [math.nan] * seeds
    reference = {
        h: _seed_losses(rows[envelope], runs, seeds, h) if envelope else missing for h in horizons
    }
    for row in rows.values():
        if not row["source"]:
            continue
        row["seeds"] = {}
        for h in horizons:
            losses = _seed_losses(row, runs, seeds, h)
            mean, half, n = interval(losses)
            gaps = [a - b for a, b in zip(losses, reference[h], strict=True)]
            gap, gap_half, _ = interval(gaps)
            row["seeds"][h] = {
                "losses": losses,
                "mean": mean,
                "half_width": half,
                "n": n,
                "gap": gap,
                "gap_half_width": gap_half,
                "verdict": verdict(gap, gap_half),
            }


def seeds_markdown(table: dict[str, Any]) -> str:
    """The table over seeds: mean ± the 95% interval's half-width, then the gap to the
    envelope paired by seed, and its verdict (better or worse only where the interval
    excludes 0)."""
    horizons, seeds = [f"{h:g}" for h in table["horizons"]], table["seeds"]
    lines = [
        f"## Over {seeds} seeds: mean ± 95% interval (gap to the envelope at the last "
        "iterate, paired by seed: mean ± 95% interval, verdict)",
        "",
        "Seed 0 is the seed the grids and the sweep chose on, so its envelope is a minimum over "
        "its grid; seeds 1 and up only measure. Rows without replicas (the envelope where each "
        "run counts with its best EMA, whose LR may differ) are left out.",
        "",
        "| method | " + " | ".join(f"{h}x" for h in horizons) + " |",
        "| --- | " + " | ".join("---" for _ in horizons) + " |",
    ]
    for label, row in table["rows"].items():
        if "seeds" not in row:
            continue
        cells = []
        for h in horizons:
            cell = row["seeds"][h]
            if cell["n"] == 0:
                cells.append("n/a")
                continue
            counted = "" if cell["n"] == seeds else f" [{cell['n']} seeds]"
            cells.append(
                f"{cell['mean']:.4f} ± {cell['half_width']:.4f}{counted} "
                f"({cell['gap']:+.4f} ± {cell['gap_half_width']:.4f}, {cell['verdict']})"
            )
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
