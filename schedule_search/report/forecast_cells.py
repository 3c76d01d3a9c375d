"""The sweep's forecast beside the transfer's measured cells, with the error of each.

Where the sweep has a forecast (`schedule-search forecast NAME` wrote
`forecast/forecast.json`, fitted on the sweep's curves alone), each forecast row is set beside
the row the transfer measured: a user sees how far the forecast held on the horizons that were
trained before trusting one for a horizon nobody trained. The forecast never enters the
measured table and is never fitted on the transfer's results.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["MEASURED_AS", "forecast_cells", "forecast_markdown", "read_forecast"]

#: Forecast row -> the start of the label of the transfer row it predicts. The recipe's
#: forecast is of its best EMA; the transfer scores it at its own EMA fraction (the error
#: includes the difference, small where the recipe's fraction is the bank's best).
MEASURED_AS = {
    "recipe (best EMA)": "recipe (",
    "constant + EMA (best EMA)": "constant + EMA",
    "cosine envelope (last iterate)": "cosine envelope (last iterate)",
    "linear-to-zero envelope (last iterate)": "linear-to-zero envelope (last iterate)",
}


#: The numbers of a forecast cell.
NUMBERS = ("loss", "low", "high")


def read_forecast(sweep_root: Path, recipe_trial: str | None) -> dict[str, Any] | None:
    """The sweep's forecast of the transferred recipe, or None where there is none (or it is
    of another recipe trial, or cannot be read, or is not shaped as `forecast` writes it: the
    table is written without it)."""
    if recipe_trial is None:
        return None
    path = sweep_root / "forecast" / "forecast.json"
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not _well_formed(document) or document.get("recipe_trial") != recipe_trial:
        return None
    for row in document["rows"].values():  # a number that was not finite is written as null
        for cell in row.values():
            cell.update({key: math.nan for key in NUMBERS if cell[key] is None})
    return document


def _well_formed(document: Any) -> bool:
    """rows: label -> horizon -> a cell with numbers (or null) for loss, low and high."""
    rows = document.get("rows") if isinstance(document, dict) else None
    if not isinstance(rows, dict) or not all(isinstance(row, dict) for row in rows.values()):
        return False
    return all(
        isinstance(cell, dict)
        and all(key in cell and isinstance(cell[key], int | float | None) for key in NUMBERS)
        for row in rows.values()
        for cell in row.values()
    )


def forecast_cells(forecast: dict[str, Any], table: dict[str, Any]) -> dict[str, Any]:
    """Forecast row -> horizon -> {forecast, low, high, measured, error} for every horizon the
    forecast and the table share (error = forecast - measured; NaN where nothing was
    measured)."""
    out: dict[str, Any] = {}
    for label, cells in forecast.get("rows", {}).items():
        prefix = MEASURED_AS.get(label)
        measured: dict[str, float] = next(
            (
                row["loss"]
                for name, row in table["rows"].items()
                if prefix and name.startswith(prefix)
            ),
            {},
        )
        out[label] = {}
        for h in (f"{h:g}" for h in table["horizons"]):
            if h not in cells:
                continue
            loss = float(measured.get(h, math.nan))
            out[label][h] = {
                "forecast": cells[h]["loss"],
                "low": cells[h]["low"],
                "high": cells[h]["high"],
                "measured": loss,
                "error": cells[h]["loss"] - loss,
            }
    return out


def forecast_markdown(cells: dict[str, Any], horizons: list[float]) -> str:
    names = [f"{h:g}" for h in horizons]
    lines = [
        "## The sweep's forecast beside the measured cells",
        "",
        "Fitted on the sweep's curves alone (`forecast/forecast.json`), never on these runs: "
        "forecast [interval] (measured, error = forecast - measured). The recipe's row is its "
        "own curve continued where its trial evaluated often enough (interval: the curve "
        "refitted without each evaluation), the law's otherwise and for every other row "
        "(interval: 10th-90th percentile of its refits).",
        "",
        "| forecast of | " + " | ".join(f"{h}x" for h in names) + " |",
        "| --- | " + " | ".join("---" for _ in names) + " |",
    ]
    for label, row in cells.items():
        texts = []
        for h in names:
            cell = row.get(h)
            if cell is None:
                texts.append("-")
                continue
            text = f"{cell['forecast']:.4f} [{cell['low']:.4f}, {cell['high']:.4f}]"
            if math.isfinite(cell["measured"]):
                text += f" ({cell['measured']:.4f}, {cell['error']:+.4f})"
            texts.append(text)
        lines.append(f"| {label} | " + " | ".join(texts) + " |")
    return "\n".join(lines) + "\n"
