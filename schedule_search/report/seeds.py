"""The transfer table over seeds: each cell a mean with a 95% interval, each gap to the envelope
paired seed by seed, and a gap called better or worse only where its interval excludes 0.

Every run is scored on the task's one held-out sample (a seed changes initialization and data
order, not the yardstick), so the gap of seed k is the difference of two runs evaluated alike;
the interval of the mean gap is Student's t over the K paired differences (K - 1 degrees of
freedom). A row's seed-k loss comes from the replica of the run its seed-0 loss came from
(`row["source"]`); a cell whose replica is missing counts the seeds it has (`n`), its gap the
pairs it has (`gap_n`).

A replica that diverged is not missing: its loss is +inf, as the LR grids rank a diverged run
last. The mean and interval are over the finite seeds, and a row that diverged on any seed
its envelope did not reads worse, whatever its other seeds say.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from scipy import stats

from schedule_search.transfer.scores import History, loss_at
from schedule_search.transfer.seeds import seeded

__all__ = [
    "CONFIDENCE",
    "add_seed_statistics",
    "interval",
    "paired",
    "plus_minus",
    "seeds_markdown",
    "verdict",
]

CONFIDENCE = 0.95
#: The verdict of the envelope's own row: its gap to itself is 0 by construction.
REFERENCE = "the reference"


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


def verdict(mean: float, half_width: float, diverged: int = 0) -> str:
    """How a gap (row minus envelope) reads: worse where the row diverged on `diverged` seeds
    its envelope did not; else better or worse only where the interval excludes 0; otherwise
    within the noise of the seeds."""
    if diverged:
        return f"worse: diverged on {diverged} seed{'s' if diverged > 1 else ''}"
    if not (math.isfinite(mean) and math.isfinite(half_width)):
        return "n/a"
    if mean + half_width < 0:
        return "better"
    if mean - half_width > 0:
        return "worse"
    return "within noise"


def _seed_losses(row: dict[str, Any], runs: dict[str, History], seeds: int, h: float) -> list:
    """Each seed's loss at `h`: NaN where its run is missing, +inf where its run ended without
    a finite loss there (the table is made once every run has ended: it diverged)."""
    name, score = row["source"].get(h, (None, "last"))

    def ended_as(loss: float, run: str | None) -> float:
        return loss if math.isfinite(loss) or run not in runs else math.inf

    losses = [ended_as(row["loss"][h], name)]
    for seed in range(1, seeds):
        replica = seeded(name, seed) if name else None
        found = runs.get(replica) if replica else None
        losses.append(ended_as(loss_at(found, h, score), replica) if found else math.nan)
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
            gap, gap_half, gap_n, diverged_alone, envelope_diverged = paired(losses, reference[h])
            row["seeds"][h] = {
                "losses": losses,
                "mean": mean,
                "half_width": half,
                "n": n,
                "diverged": losses.count(math.inf),
                "gap": gap,
                "gap_half_width": gap_half,
                "gap_n": gap_n,
                "envelope_diverged": envelope_diverged,
                "diverged_alone": diverged_alone,
                "verdict": REFERENCE
                if envelope is not None and _same_runs(row, rows[envelope], h)
                else verdict(gap, gap_half, diverged_alone),
            }


def paired(ours: list[float], theirs: list[float]) -> tuple[float, float, int, int, int]:
    """(mean, half-width, n) of `ours - theirs` seed by seed over the seeds where both ended
    with a loss, then how many seeds only ours diverged on and how many only theirs did. A
    divergence counts only against a seed that ended with a loss: with none to pair with (a
    missing run) there is no gap to call worse."""
    pairs = list(zip(ours, theirs, strict=True))
    gap, half, n = interval([a - b for a, b in pairs])
    ours_alone = sum(1 for a, b in pairs if a == math.inf and math.isfinite(b))
    theirs_alone = sum(1 for a, b in pairs if b == math.inf and math.isfinite(a))
    return gap, half, n, ours_alone, theirs_alone


def _same_runs(row: dict[str, Any], envelope: dict[str, Any], h: float) -> bool:
    """Whether `row` reads at `h` the very runs the envelope reads (the kind whose grid won
    there): its gap is 0 by construction, not a measurement."""
    return row["source"].get(h) == envelope["source"].get(h)


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
        "its grid and the recipe the sweep's best on the held-out sample; seeds 1 and up only "
        "measure, and a row scored by its bank's best is read on them at the member seed 0 "
        "chose. Rows without replicas (the envelope where each run counts with its best EMA, "
        "whose LR may differ) are left out.",
        "",
        _chance_line(table),
        "",
        "| method | " + " | ".join(f"{h}x" for h in horizons) + " |",
        "| --- | " + " | ".join("---" for _ in horizons) + " |",
    ]
    for label, row in table["rows"].items():
        if "seeds" not in row:
            continue
        cells = [_cell_text(row["seeds"][h], seeds) for h in horizons]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _chance_line(table: dict[str, Any]) -> str:
    """How many gaps the table judges: at 95% each, about one in twenty reads better or worse
    by chance alone where no method differs."""
    judged = sum(
        1
        for row in table["rows"].values()
        for cell in row.get("seeds", {}).values()
        if math.isfinite(cell["gap_half_width"]) and cell["verdict"] != REFERENCE
    )
    return (
        f"{judged} gaps are judged, each at 95%: were no method different, about "
        f"{judged / 20:.1f} of them would read better or worse by chance alone."
    )


def plus_minus(mean: float, half_width: float, signed: bool = False) -> str:
    """`mean ± half-width`, or `mean, no interval` where there is none."""
    value = f"{mean:+.4f}" if signed else f"{mean:.4f}"
    return f"{value} ± {half_width:.4f}" if math.isfinite(half_width) else f"{value}, no interval"


def _cell_text(cell: dict[str, Any], seeds: int) -> str:
    """`mean ± half-width [seeds counted, if not all] (gap ± half-width [pairs], verdict)`."""
    if cell["n"] == 0 and not cell["diverged"]:
        return "n/a"
    counted = [f"{cell['n']} of {seeds} seeds"] if cell["n"] < seeds else []
    if cell["diverged"]:
        counted.append(f"{cell['diverged']} diverged")
    loss = plus_minus(cell["mean"], cell["half_width"]) if cell["n"] else "diverged"
    loss += f" [{', '.join(counted)}]" if counted else ""
    if not math.isfinite(cell["gap"]) or cell["verdict"] == REFERENCE:
        return f"{loss} ({cell['verdict']})"
    pairs = [f"{cell['gap_n']} pair{'s' if cell['gap_n'] != 1 else ''}"]
    pairs = pairs if cell["gap_n"] < seeds else []
    if cell["envelope_diverged"]:
        pairs.append(f"the envelope diverged on {cell['envelope_diverged']}")
    gap = plus_minus(cell["gap"], cell["gap_half_width"], signed=True)
    gap += f" [{', '.join(pairs)}]" if pairs else ""
    return f"{loss} ({gap}, {cell['verdict']})"
