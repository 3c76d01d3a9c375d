"""The transfer's figures: losses against tokens, the gap to the envelope against the horizon
(the paper's view, where 0.01 nats are visible), and the LR schedules of the rows."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from schedule_search.core.config import parse
from schedule_search.report.figures import plt, save_figure
from schedule_search.train.config import TrainConfig
from schedule_search.transfer.plan import History, TransferStudy, last_iterate

__all__ = ["plot_gaps", "plot_losses", "plot_lrs"]


def plot_gaps(path: Path, table: dict[str, Any]) -> None:
    """Each method's gap to the envelope (last iterate) against the horizon: with seeds, the
    mean gap paired by seed and its 95% interval as error bars; with one seed, the gap."""
    horizons = [f"{h:g}" for h in table["horizons"]]
    x = [float(h) for h in horizons]
    figure, axis = plt.subplots(figsize=(8, 5))
    axis.axhline(0.0, color="k", linewidth=1, label="envelope (best of both, last iterate)")
    for label, row in table["rows"].items():
        if label.startswith(("envelope", "cosine envelope", "linear-to-zero envelope")):
            continue
        if table["seeds"] > 1:
            if "seeds" not in row:
                continue
            gaps = [row["seeds"][h]["gap"] for h in horizons]
            errors = [row["seeds"][h]["gap_half_width"] for h in horizons]
        else:
            gaps, errors = [row["gap_last"][h] for h in horizons], [math.nan] * len(horizons)
        if not any(math.isfinite(g) for g in gaps):
            continue
        errors = [e if math.isfinite(e) else 0.0 for e in errors]
        axis.errorbar(x, gaps, yerr=errors, fmt="o-", capsize=3, label=label, markersize=4)
    axis.set_xscale("log", base=2)
    axis.set_xticks(x, [f"{h}x" for h in horizons])
    axis.set_xlabel("horizon (Chinchilla multiples)")
    seeds = table["seeds"]
    interval = f"mean over {seeds} seeds paired by seed, 95% interval" if seeds > 1 else "1 seed"
    axis.set_ylabel(f"loss - envelope (nats; {interval})")
    axis.legend(fontsize=7)
    axis.grid(alpha=0.3)
    save_figure(figure, path)


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
