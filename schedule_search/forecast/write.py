"""`forecast/forecast.json` and `forecast/forecast.png` of a sweep's forecast."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from schedule_search.core.files import atomic_write_text, strict_json
from schedule_search.forecast.predict import INTERVALS, Forecast

__all__ = ["write_forecast"]


def write_forecast(forecast: Forecast, folder: Path) -> Path:
    """Writes the forecast's JSON and plot into `folder`; returns the JSON's path."""
    folder.mkdir(parents=True, exist_ok=True)
    laws = {
        name: {
            **asdict(fit.law),
            "curves": len(fit.curves),
            "points": sum(len(c.points) for c in fit.curves),
        }
        for name, fit in forecast.laws.items()
    }
    rows = {
        label: {f"{h:g}": asdict(cell) for h, cell in cells.items()}
        for label, cells in forecast.rows.items()
    }
    document = {
        "horizons": forecast.horizons,
        "recipe_trial": forecast.recipe_trial,
        "interval": {basis: INTERVALS[basis] for basis in forecast.bases()},
        "laws": laws,
        "rows": rows,
    }
    path = folder / "forecast.json"
    atomic_write_text(path, strict_json(document))
    _plot(forecast, folder / "forecast.png")
    return path


def _plot(forecast: Forecast, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for label, cells in forecast.rows.items():
        horizons = sorted(cells)
        losses = [cells[h].loss for h in horizons]
        line = axes.plot(horizons, losses, marker="o", label=label)[0]
        axes.fill_between(
            horizons,
            [cells[h].low for h in horizons],
            [cells[h].high for h in horizons],
            color=line.get_color(),
            alpha=0.15,
        )
    axes.set_xscale("log", base=2)
    axes.set_xlabel("horizon (Chinchilla multiples)")
    axes.set_ylabel("forecast validation loss")
    axes.set_title(f"forecast from the sweep's curves (recipe: trial {forecast.recipe_trial})")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
