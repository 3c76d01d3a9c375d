"""Tables and plots from an experiment folder (matplotlib, headless)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from schedule_search.checkpoint import atomic_write_bytes, atomic_write_text
from schedule_search.config import parse
from schedule_search.experiment import Experiment
from schedule_search.train import TrainConfig
from schedule_search.transfer import TransferPlan, histories, loss_at


def save_figure(figure: plt.Figure, path: Path) -> None:
    import io

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(figure)
    atomic_write_bytes(path, buffer.getvalue())


def transfer_table(plan: TransferPlan, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Validation loss per horizon per method, and each method's gap to the cosine envelope."""
    horizons = plan.horizons
    envelope, envelope_run = {}, {}
    for h in horizons:
        candidates = {
            name: loss_at(history, h)
            for name, history in runs.items()
            if name.startswith(f"cosine-{h:g}x-")
        }
        finite = {n: v for n, v in candidates.items() if math.isfinite(v)}
        envelope[h] = min(finite.values()) if finite else math.nan
        envelope_run[h] = min(finite, key=finite.get) if finite else None
    methods: dict[str, dict[float, float]] = {}
    for name, label in (
        ("recipe", "recipe (anytime + EMA)"),
        ("constant", "constant + EMA"),
        ("poly", "1/sqrt + EMA"),
    ):
        if name in runs:
            methods[label] = {h: loss_at(runs[name], h) for h in horizons}
    if plan.branches:
        methods["WSD (last iterate)"] = {
            h: loss_at(runs.get(f"wsd-{h:g}x", []), h) for h in horizons
        }
    top = max(horizons)
    if envelope_run.get(top):
        methods[f"cosine tuned for {top:g}x"] = {
            h: loss_at(runs[envelope_run[top]], h) for h in horizons
        }
    methods["cosine envelope"] = envelope
    gaps = {m: {h: v[h] - envelope[h] for h in horizons} for m, v in methods.items()}
    return {
        "horizons": horizons,
        "loss": {m: {f"{h:g}": v for h, v in values.items()} for m, values in methods.items()},
        "gap_to_envelope": {m: {f"{h:g}": v for h, v in g.items()} for m, g in gaps.items()},
        "envelope_runs": {f"{h:g}": envelope_run[h] for h in horizons},
    }


def _markdown(table: dict[str, Any]) -> str:
    horizons = [f"{h:g}" for h in table["horizons"]]
    lines = [
        "| method | " + " | ".join(f"{h}x loss (gap)" for h in horizons) + " |",
        "| --- | " + " | ".join("---" for _ in horizons) + " |",
    ]
    for method, losses in table["loss"].items():
        cells = []
        for h in horizons:
            loss, gap = losses[h], table["gap_to_envelope"][method][h]
            cells.append(f"{loss:.4f} ({gap:+.4f})" if math.isfinite(loss) else "n/a")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_transfer_report(
    root: Path, plan: TransferPlan, phases: list[Experiment], base: TrainConfig
) -> dict[str, Any]:
    runs = histories(phases)
    for method, run in plan.same_as.items():
        runs[method] = runs.get(run, [])
    table = transfer_table(plan, runs)
    atomic_write_text(root / "transfer.json", json.dumps(table, indent=1))
    atomic_write_text(
        root / "transfer.md",
        "# Transfer: validation loss per horizon, (gap to the cosine envelope)\n\n"
        + _markdown(table),
    )
    _plot_losses(root / "loss_vs_tokens.png", plan, runs, table)
    _plot_lrs(root / "lr_curves.png", plan, base)
    return table


def _plot_losses(path: Path, plan: TransferPlan, runs: dict, table: dict) -> None:
    figure, axis = plt.subplots(figsize=(8, 5))
    for name in ("recipe", "constant", "poly"):
        history = runs.get(name) or []
        if history:
            axis.plot(
                [r["tokens"] for r in history],
                [r["val_loss"] for r in history],
                marker="o",
                label=name,
            )
    for name, history in runs.items():
        if name.startswith("cosine-") and history:
            axis.plot(
                [r["tokens"] for r in history],
                [r["val_loss"] for r in history],
                color="grey",
                alpha=0.3,
                linewidth=1,
            )
    envelope = table["loss"]["cosine envelope"]
    points = [
        (runs[run][-1]["tokens"], envelope[f"{h:g}"])
        for h, run in zip(plan.horizons, table["envelope_runs"].values(), strict=True)
        if run is not None
    ]
    if points:
        axis.plot(*zip(*points, strict=True), "k*--", markersize=10, label="cosine envelope")
    wsd = [(runs[n][-1]["tokens"], runs[n][-1]["val_loss"]) for n in plan.branches if runs.get(n)]
    if wsd:
        axis.plot(*zip(*wsd, strict=True), "rs", label="WSD (last iterate)")
    axis.set_xscale("log")
    axis.set_xlabel("tokens")
    axis.set_ylabel("validation loss")
    axis.legend()
    axis.grid(alpha=0.3)
    save_figure(figure, path)


def _plot_lrs(path: Path, plan: TransferPlan, base: TrainConfig) -> None:
    top = max(plan.horizons)
    grid = [top * i / 400 for i in range(401)]
    figure, axis = plt.subplots(figsize=(8, 4))
    curves = {
        "recipe": plan.runs.get("recipe"),
        "constant": plan.runs.get("constant"),
        "1/sqrt": plan.runs.get("poly"),
    }
    cosine_top = plan.runs.get(f"cosine-{top:g}x-lr1")
    if cosine_top:
        curves[f"cosine T={top:g}x"] = cosine_top
    for label, config in curves.items():
        if config is None:
            continue
        parsed = parse(TrainConfig, config, label)
        schedule = parsed.schedule.build(1.0)  # t in Chinchilla multiples
        axis.plot(grid, [parsed.optimizer.lr * schedule(t) for t in grid], label=label)
    if plan.branches and "constant" in plan.runs:
        wsd = dataclasses.replace(base.schedule, kind="wsd", horizon=top, decay_fraction=0.1)
        schedule = wsd.build(1.0)
        axis.plot(
            grid, [base.optimizer.lr * schedule(t) for t in grid], "--", label=f"WSD T={top:g}x"
        )
    axis.set_xlabel("Chinchilla multiple")
    axis.set_ylabel("learning rate")
    axis.legend()
    axis.grid(alpha=0.3)
    save_figure(figure, path)
