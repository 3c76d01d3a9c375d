"""The transfer's figures: losses against tokens, the gap to the envelope against the horizon
(the paper's view, where 0.01 nats are visible), and the LR schedules of the rows."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from matplotlib.transforms import blended_transform_factory
from matplotlib.typing import ColorType

from schedule_search.core.config import parse
from schedule_search.report.figures import plt, save_figure
from schedule_search.train.config import TrainConfig
from schedule_search.transfer.plan import TransferStudy
from schedule_search.transfer.scores import History, last_iterate

__all__ = ["gap_figure", "plot_gaps", "plot_losses", "plot_lrs"]


def plot_gaps(path: Path, table: dict[str, Any]) -> None:
    save_figure(gap_figure(table), path)


def gap_figure(table: dict[str, Any]) -> plt.Figure:
    """Each method's gap to the envelope (last iterate) against the horizon: with seeds, the
    mean gap paired by seed and its 95% interval as error bars; with one seed, the gap. A
    horizon where a row diverged on every seed has no gap to draw: it is marked with an x near
    the top edge, and a row with no finite gap at all still has its legend entry, so that
    nothing a user might pick vanishes from the picture."""
    horizons = [f"{h:g}" for h in table["horizons"]]
    x = [float(h) for h in horizons]
    figure, axis = plt.subplots(figsize=(8, 5))
    axis.axhline(0.0, color="k", linewidth=1, label="envelope (best of both, last iterate)")
    top_edge = blended_transform_factory(axis.transData, axis.transAxes)
    lanes = 0
    for label, row in table["rows"].items():
        if label.startswith(("envelope", "cosine envelope", "linear-to-zero envelope")):
            continue
        if table["seeds"] > 1:
            if "seeds" not in row:
                continue
            cells = [row["seeds"][h] for h in horizons]
            gaps = [cell["gap"] for cell in cells]
            errors = [cell["gap_half_width"] for cell in cells]
            diverged = [cell["diverged_alone"] > 0 for cell in cells]
            lost = [cell["n"] == 0 and cell["diverged"] > 0 for cell in cells]
        else:
            gaps, errors = [row["gap_last"][h] for h in horizons], [math.nan] * len(horizons)
            diverged = [False] * len(horizons)
            lost = [row["diverged"][h] for h in horizons]
        if any(math.isfinite(g) for g in gaps):
            color = axis.plot(x, gaps, "-", label=label)[0].get_color()
            _draw_points(axis, x, gaps, errors, diverged, color, hollow=table["seeds"] > 1)
        elif any(lost):
            color = axis.plot([], [], "x", markersize=9, label=f"{label} (diverged)")[0].get_color()
        else:
            continue
        gone = [x[i] for i, flag in enumerate(lost) if flag]
        if gone:  # each row that diverged has a lane of its own, so no mark hides another
            lane = 0.97 - 0.04 * lanes
            axis.plot(gone, [lane] * len(gone), "x", color=color, markersize=9, transform=top_edge)
            lanes += 1
    axis.set_xscale("log", base=2)
    axis.set_xticks(x, [f"{h}x" for h in horizons])
    axis.set_xlabel("horizon (Chinchilla multiples)")
    axis.set_ylabel("loss - envelope (nats)")
    seeds = table["seeds"]
    axis.set_title(
        f"mean over up to {seeds} seeds, paired by seed, with its 95% interval\n"
        "(hollow: no interval; black x: diverged on a seed its envelope did not, the mean is "
        "over the others; x at the top: diverged on every seed)"
        if seeds > 1
        else "one seed (x at the top: diverged)",
        fontsize=9,
    )
    axis.legend(fontsize=7)
    axis.grid(alpha=0.3)
    return figure


def _draw_points(
    axis: plt.Axes,
    x: list[float],
    gaps: list[float],
    errors: list[float],
    diverged: list[bool],
    color: ColorType,
    hollow: bool,
) -> None:
    """A row's gaps: with their intervals as error bars; hollow (with seeds) where there is no
    interval rather than an interval of width 0; a black x where the row diverged on a seed
    its envelope did not, which reads worse there whatever its other seeds' mean."""
    bars = [i for i, e in enumerate(errors) if math.isfinite(e)]
    axis.errorbar(
        [x[i] for i in bars],
        [gaps[i] for i in bars],
        yerr=[errors[i] for i in bars],
        fmt="o",
        capsize=3,
        markersize=4,
        color=color,
    )
    bare = [i for i, e in enumerate(errors) if not math.isfinite(e)]
    axis.plot(
        [x[i] for i in bare],
        [gaps[i] for i in bare],
        "o",
        color=color,
        mfc="none" if hollow else color,
    )
    marked = [i for i, flag in enumerate(diverged) if flag and math.isfinite(gaps[i])]
    axis.plot([x[i] for i in marked], [gaps[i] for i in marked], "kx", markersize=9)


def plot_losses(path: Path, study: TransferStudy, runs: dict[str, History], table: dict) -> None:
    figure, axis = plt.subplots(figsize=(8, 5))
    tokens_at = {}
    for history in runs.values():
        for row in history:
            tokens_at[row.chinchilla] = row.tokens
    for label, row in table["rows"].items():
        points = [
            (tokens_at[h], row["loss"][f"{h:g}"])
            for h in study.horizons
            if h in tokens_at and math.isfinite(row["loss"][f"{h:g}"])
        ]
        if not points:
            continue
        style = "k*--" if label.startswith("envelope") else "o-"
        axis.plot(*zip(*points, strict=True), style, label=label, markersize=6)
    for name, history in runs.items():
        if name.startswith(("cosine-", "linear-")) and history:
            axis.plot(
                [r.tokens for r in history],
                [last_iterate(r) for r in history],
                color="grey",
                alpha=0.25,
                linewidth=1,
            )
    axis.set_xscale("log")
    axis.set_xlabel("tokens")
    axis.set_ylabel("validation loss")
    axis.legend(fontsize=7)
    axis.grid(alpha=0.3)
    save_figure(figure, path)


def plot_lrs(path: Path, study: TransferStudy, records: dict[str, Any]) -> None:
    top = study.top
    grid = [top * i / 400 for i in range(401)]
    figure, axis = plt.subplots(figsize=(8, 4))
    shown = {"recipe": "recipe", "constant": "constant"}
    for name, label in shown.items():
        if name in records:
            parsed = parse(TrainConfig, records[name].config, label)
            schedule = parsed.schedule.build(1.0)  # t in Chinchilla multiples
            axis.plot(grid, [parsed.optimizer.lr * schedule(t) for t in grid], label=label)
    for kind in study.envelope_kinds:
        spec = study.grid(kind, top, {n: r.history for n, r in records.items()})
        best = spec.state({n: r.history for n, r in records.items()}).best_lr if spec else None
        if spec is not None and best is not None and spec.run_name(best) in records:
            parsed = parse(TrainConfig, records[spec.run_name(best)].config, kind)
            schedule = parsed.schedule.build(1.0)
            axis.plot(
                grid, [parsed.optimizer.lr * schedule(t) for t in grid], label=f"{kind} T={top:g}x"
            )
    axis.set_xlabel("Chinchilla multiple")
    axis.set_ylabel("learning rate")
    axis.legend()
    axis.grid(alpha=0.3)
    save_figure(figure, path)
