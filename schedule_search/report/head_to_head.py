"""The recipe against each row a user would run instead, paired by seed.

The seeds table judges every row against one reference, the envelope. A user choosing between
the recipe and, say, WSD asks another question: is the recipe worse than that row? Each cell
here is the recipe's loss minus the row's, seed by seed (both scored on the task's one held-out
sample), with the 95% t-interval of the mean difference, and worded as the seeds table words a
gap: better or worse only where the interval excludes 0, worse wherever the recipe diverged on
a seed the row did not.
"""

from __future__ import annotations

import math
from typing import Any

from schedule_search.report.seeds import paired, plus_minus, verdict

__all__ = ["head_to_head", "head_to_head_markdown"]


def head_to_head(rows: dict[str, dict[str, Any]], horizons: list[float]) -> dict[str, Any]:
    """Per row with replicas but the recipe, per horizon: the recipe minus the row, paired by
    seed (`gap`, `half_width`, `n` pairs), the seeds where only one of them diverged, and the
    verdict for the recipe. Empty without a recipe row with replicas."""
    recipe = next((label for label in rows if label.startswith("recipe")), None)
    if recipe is None or "seeds" not in rows[recipe]:
        return {}
    ours = rows[recipe]["seeds"]
    out: dict[str, Any] = {}
    for label, row in rows.items():
        if label == recipe or "seeds" not in row:
            continue
        out[label] = {}
        for h in horizons:
            gap, half, n, recipe_alone, row_alone = paired(
                ours[h]["losses"], row["seeds"][h]["losses"]
            )
            out[label][f"{h:g}"] = {
                "gap": gap,
                "half_width": half,
                "n": n,
                "recipe_diverged": recipe_alone,
                "row_diverged": row_alone,
                "verdict": verdict(gap, half, recipe_alone),
                # The run the row reads at h (and how it is scored): two rows reading the same
                # run (an envelope and the kind that won it) are one comparison, not two.
                "run": list(row["source"].get(h, (None, "last"))),
            }
    return {"recipe": recipe, "rows": out}


def head_to_head_markdown(table: dict[str, Any]) -> str:
    """The recipe minus each row, one line per row; '' where there is nothing to compare."""
    versus = table.get("head_to_head") or {}
    if not versus.get("rows"):
        return ""
    horizons, seeds = [f"{h:g}" for h in table["horizons"]], table["seeds"]
    cells = [(h, cell) for row in versus["rows"].values() for h, cell in row.items()]
    judged = len({(h, str(c["run"])) for h, c in cells if math.isfinite(c["half_width"])})
    lines = [
        f"## The recipe against each row, paired by seed (recipe minus row over {seeds} seeds: "
        "mean ± 95% interval, verdict for the recipe)",
        "",
        f"The recipe: {versus['recipe']}. {judged} distinct differences are judged (rows that read "
        "the same runs count once), each at 95%: were no "
        f"method different, about {judged / 20:.1f} of them would read better or worse by chance "
        "alone.",
        "",
        "| row | " + " | ".join(f"{h}x" for h in horizons) + " |",
        "| --- | " + " | ".join("---" for _ in horizons) + " |",
    ]
    for label, row in versus["rows"].items():
        lines.append(f"| {label} | " + " | ".join(_cell(row[h], seeds) for h in horizons) + " |")
    return "\n".join(lines) + "\n"


def _cell(cell: dict[str, Any], seeds: int) -> str:
    """`gap ± half-width [pairs, if not all; who diverged alone], verdict`."""
    notes = [f"{cell['n']} pair{'s' if cell['n'] != 1 else ''}"] if cell["n"] < seeds else []
    if cell["recipe_diverged"]:
        notes.append(f"the recipe diverged on {cell['recipe_diverged']}")
    if cell["row_diverged"]:
        notes.append(f"the row diverged on {cell['row_diverged']}")
    gap = plus_minus(cell["gap"], cell["half_width"], signed=True) if cell["n"] else "no pair"
    counted = f" [{', '.join(notes)}]" if notes else ""
    return f"{gap}{counted}, {cell['verdict']}"
