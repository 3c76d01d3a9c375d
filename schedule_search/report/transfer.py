"""The transfer's table, JSON and plots (matplotlib, headless).

Every row is scored by its own protocol (the recipe with its EMA fraction, constant + EMA with
the best of its bank, schedule-free AdamW at its averaged weights, WSD and the envelopes at the
last iterate) and compared with two envelopes computed from the same runs: the paper's (each
cosine or linear-to-zero run at its last iterate) and one where every run counts with the best
member of its EMA bank. `transfer.json` keeps every run's loss at every horizon it reached.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from schedule_search.core.files import atomic_write_text, strict_json
from schedule_search.report.forecast_cells import forecast_cells, forecast_markdown, read_forecast
from schedule_search.report.head_to_head import head_to_head, head_to_head_markdown
from schedule_search.report.seeds import add_seed_statistics, seeds_markdown
from schedule_search.report.transfer_figures import plot_gaps, plot_losses, plot_lrs
from schedule_search.transfer.plan import WSD, TransferStudy
from schedule_search.transfer.scores import (
    History,
    at_horizon,
    best_of_bank,
    last_iterate,
    loss_at,
)
from schedule_search.transfer.seeds import seed_of

__all__ = ["ENVELOPE_ROW", "run_table", "transfer_table", "write_transfer_report"]

#: The row every gap is measured against: the best of both envelopes at the last iterate.
ENVELOPE_ROW = "envelope (best of both, last iterate)"


def _envelope(
    study: TransferStudy, kind: str, runs: dict[str, History], score: str
) -> dict[float, tuple[float, str | None, bool]]:
    """horizon -> (best loss, its run, whether that best is interior in its grid)."""
    out: dict[float, tuple[float, str | None, bool]] = {}
    for h in study.horizons:
        spec = study.grid(kind, h, runs)
        if spec is None:
            out[h] = (math.nan, None, False)
            continue
        losses = {
            spec.run_name(lr): loss
            for lr, loss in spec.losses(runs, score).items()
            if math.isfinite(loss)
        }
        if not losses:
            out[h] = (math.nan, None, False)
            continue
        state = spec.state(runs, score)
        # The grid's own choice (a tie goes to the lower LR): the run whose replicas exist.
        best = spec.run_name(state.best_lr) if state.best_lr is not None else None
        if best not in losses:
            best = min(losses, key=lambda run: (losses[run], spec.lr_of(run)))
        out[h] = (losses[best], best, state.interior)
    return out


def _merged(first: History, then: History, upto: float) -> History:
    return [r for r in first if r.chinchilla <= upto + 1e-9] + then


Row = dict[str, Any]


def _row(
    loss: dict[float, float],
    compute: float,
    note: str = "",
    source: Mapping[float, tuple[str | None, str | float]] | None = None,
) -> Row:
    """A table row; `source` names, per horizon, the seed-0 run and the score its loss came
    from, so that other seeds read the same cell from that run's replicas (`report.seeds`)."""
    return {"loss": loss, "compute": compute, "note": note, "source": dict(source or {})}


def _from(study: TransferStudy, name: str | None, score: str | float) -> dict:
    return {h: (name, score) for h in study.horizons}


def _chosen_members(name: str, history: History, horizons: list[float]) -> dict:
    """Where the replicas of run `name`, scored by its bank's best, are read: at the member
    seed 0 chose at each horizon. Choosing again on each seed's own evaluation would give the
    row a selection its rivals' replicas do not get."""
    source: dict[float, tuple[str, str | float]] = {}
    for h in horizons:
        row = at_horizon(history, h)
        fraction = best_of_bank(row)[1] if row is not None else math.nan
        source[h] = (name, fraction if math.isfinite(fraction) else "ema")
    return source


def _recipe_row(study: TransferStudy, runs: dict[str, History], sweep_history: History) -> tuple:
    """The recipe, scored with its own EMA fraction; before the continuation its history is
    the sweep trial's."""
    family = "schedule-free AdamW + EMA" if study.schedule_free_recipe else "anytime + EMA"
    history, compute, label = runs["recipe"], study.top, f"recipe ({family})"
    note = f"EMA fraction {study.recipe_fraction:g}"
    if study.continue_from is not None and sweep_history:
        history = _merged(sweep_history, history, study.sweep_horizon)
        compute = study.top - study.sweep_horizon
        label = f"recipe (continued from trial {study.continued_trial} at {study.sweep_horizon:g}x)"
        note += f"; {study.sweep_horizon:g}x of compute saved by continuing"
    return label, _row(
        {h: loss_at(history, h, study.recipe_fraction) for h in study.horizons},
        compute,
        note,
        _from(study, "recipe", study.recipe_fraction),
    )


def _constant_row(study: TransferStudy, runs: dict[str, History]) -> Row:
    """Constant + EMA, scored by its bank's best: the trunk at the recipe's AdamW LR, or the
    winner of its grid at the sweep's horizon and the winner's continuation."""
    history, compute = runs["constant"], study.top
    if study.constant_lr == "recipe":
        note = f"LR {study.adamw_lr:.3g}, the recipe's AdamW LR"
    else:  # "constant" ran: its grid picked an LR
        spec = study.constant_grid()
        lr = spec.pick(runs)
        if lr is None:
            raise RuntimeError("the constant trunk ran before its grid picked an LR")
        grid = [n for n in runs if spec.lr_of(n) is not None]
        history = _merged(runs[spec.run_name(lr)], history, spec.horizon)
        compute = spec.horizon * len(grid) + study.top - spec.horizon
        note = f"LR {lr:.3g} picked at {spec.horizon:g}x from {len(grid)} runs by the bank's best"
        if bound := spec.state(runs).bound_hit:
            note += f", at the grid's {bound} bound (the optimum may lie beyond)"
    loss = {h: loss_at(history, h, "ema") for h in study.horizons}
    return _row(loss, compute, note, _chosen_members("constant", history, study.horizons))


def _method_rows(
    study: TransferStudy, runs: dict[str, History], sweep_history: History
) -> dict[str, Row]:
    """The recipe and what a practitioner would run instead, each by its own protocol."""
    horizons, rows = study.horizons, {}
    if "recipe" in runs:
        label, row = _recipe_row(study, runs, sweep_history)
        rows[label] = row
    if "constant" in runs:
        rows["constant + EMA (best of bank)"] = _constant_row(study, runs)
    spec = study.schedulefree_grid()
    best = spec.state(runs).best_lr if "schedulefree" in study.methods else None
    if best is not None:
        history = _merged(runs[spec.run_name(best)], runs.get("schedulefree", []), spec.horizon)
        grid = [n for n in runs if spec.lr_of(n) is not None]
        rows[f"schedule-free AdamW (averaged weights, LR {best:.3g})"] = _row(
            {h: loss_at(history, h, "last") for h in horizons},
            spec.horizon * len(grid) + max(0.0, study.top - spec.horizon),
            f"LR picked at {spec.horizon:g}x from {len(grid)} runs",
            _from(study, "schedulefree", "last"),
        )
    for prefix, (share, cooldown, floor) in WSD.items():
        names = {h: f"{prefix}-{h:g}x" for h in horizons}
        if any(n in runs for n in names.values()):
            shape = "1 - sqrt" if cooldown == "sqrt" else "linear"
            rows[f"WSD, {shape} to {floor:g} over the last {share:.0%} (last iterate)"] = _row(
                {h: loss_at(runs.get(n, []), h, "last") for h, n in names.items()},
                sum(share * h for h in horizons),
                "branches of the constant run (its compute not counted again)",
                {h: (n, "last") for h, n in names.items()},
            )
    return rows


def _reference_rows(
    study: TransferStudy, runs: dict[str, History], envelopes: dict
) -> dict[str, Row]:
    """The envelopes (and the cosine tuned for the largest horizon)."""
    horizons, rows = study.horizons, {}
    for kind, scores in envelopes.items():
        compute = sum(h for n in runs for h in horizons if n.startswith(f"{kind}-{h:g}x-"))
        name = "cosine" if kind == "cosine" else "linear-to-zero"
        rows[f"{name} envelope (last iterate)"] = _row(
            _losses(scores["last"]), compute, source=_runs(scores["last"], "last")
        )
        best_top = scores["last"][study.top][1]
        if kind == "cosine" and best_top is not None:
            tuned = {h: loss_at(runs[best_top], h, "last") for h in horizons}
            rows[f"cosine tuned for {study.top:g}x (last iterate)"] = _row(
                tuned, study.top, best_top, _from(study, best_top, "last")
            )
    if envelopes:
        rows[ENVELOPE_ROW] = _row(
            _best_of(envelopes, "last", horizons),
            0.0,
            "the rows above",
            _best_source(envelopes, horizons),
        )
        rows["envelope with EMA (each run's best EMA)"] = _row(
            _best_of(envelopes, "ema", horizons),
            0.0,
            "the same runs",
        )
    return rows


def transfer_table(
    study: TransferStudy, runs: dict[str, History], sweep_history: History | None = None
) -> dict[str, Any]:
    """Rows of loss per horizon with their gaps to both envelopes, the compute of each row,
    and the envelopes' runs and grid marks, from the seed-0 runs; with replicas of other
    seeds among `runs`, each row's mean over seeds and its gap to the envelope, paired by
    seed, with their 95% intervals (`report.seeds`), and the recipe against every other row,
    paired by seed (`report.head_to_head`)."""
    horizons, everything = study.horizons, runs
    runs = {name: history for name, history in runs.items() if seed_of(name)[1] == 0}
    seeds = 1 + max((seed_of(name)[1] for name in everything), default=0)
    envelopes = {
        kind: {score: _envelope(study, kind, runs, score) for score in ("last", "ema")}
        for kind in study.envelope_kinds
    }
    rows = _method_rows(study, runs, sweep_history or []) | _reference_rows(study, runs, envelopes)
    both_last = _best_of(envelopes, "last", horizons)
    both_ema = _best_of(envelopes, "ema", horizons)
    for row in rows.values():
        row["gap_last"] = {h: row["loss"][h] - both_last[h] for h in horizons}
        row["gap_ema"] = {h: row["loss"][h] - both_ema[h] for h in horizons}
        row["diverged"] = {h: _diverged(row, runs, h) for h in horizons}
    versus = {}
    if seeds > 1:
        envelope = ENVELOPE_ROW if ENVELOPE_ROW in rows else None
        add_seed_statistics(rows, everything, seeds, horizons, envelope)
        versus = head_to_head(rows, horizons)
    return {
        "horizons": horizons,
        "seeds": seeds,
        "head_to_head": versus,
        "rows": {label: _keyed(row) for label, row in rows.items()},
        "envelope_runs": {
            kind: {
                score: {f"{h:g}": {"run": r, "interior": i} for h, (_, r, i) in by_h.items()}
                for score, by_h in scores.items()
            }
            for kind, scores in envelopes.items()
        },
    }


def _diverged(row: dict[str, Any], runs: dict[str, History], h: float) -> bool:
    """Whether the seed-0 run behind `row` at `h` ended without a finite loss there: the table
    is made once every run has ended, so a run that has no loss at a horizon it trained to
    diverged (`report.seeds` reads its replicas the same way)."""
    name = row["source"].get(h, (None, "last"))[0]
    return name in runs and not math.isfinite(row["loss"][h])


def _losses(envelope: dict[float, tuple[float, str | None, bool]]) -> dict[float, float]:
    return {h: loss for h, (loss, _, _) in envelope.items()}


def _runs(envelope: dict, score: str) -> dict[float, tuple[str | None, str]]:
    return {h: (run, score) for h, (_, run, _) in envelope.items()}


def _best_source(envelopes: dict, horizons: list[float]) -> dict:
    """Per horizon, the run of the lowest envelope at the last iterate."""
    out: dict[float, tuple[str | None, str]] = {}
    for h in horizons:
        best = [e["last"][h] for e in envelopes.values() if math.isfinite(e["last"][h][0])]
        out[h] = (min(best)[1] if best else None, "last")
    return out


def _best_of(envelopes: dict, score: str, horizons: list[float]) -> dict[float, float]:
    out = {}
    for h in horizons:
        values = [e[score][h][0] for e in envelopes.values() if math.isfinite(e[score][h][0])]
        out[h] = min(values) if values else math.nan
    return out


def _keyed(row: dict[str, Any]) -> dict[str, Any]:
    """Horizons as JSON keys ('4', '8', ...)."""
    return {
        k: {f"{h:g}": v for h, v in value.items()} if isinstance(value, dict) else value
        for k, value in row.items()
    }


def run_table(runs: dict[str, Any], study: TransferStudy) -> dict[str, Any]:
    """Every run: where it lies, its schedule and LR, its compute, and its loss at every
    horizon it reached (objective, last iterate, best EMA and which)."""
    out = {}
    for name, record in runs.items():
        config = record.config
        losses = {}
        for row in record.history:
            best, frac = best_of_bank(row)
            losses[f"{row.chinchilla:g}"] = {
                "objective": row.val_loss,
                "last_iterate": last_iterate(row),
                "best_ema": best,
                "best_ema_fraction": frac,
            }
        out[name] = {
            "where": record.where,
            "optimizer": config.get("optimizer", {}).get("name"),
            "lr": config.get("optimizer", {}).get("lr"),
            "schedule": config.get("schedule"),
            "branch_from": config.get("branch_from"),
            "compute": study.length(config) if config.get("budget") else 0.0,
            "losses": losses,
        }
    return out


def _markdown(table: dict[str, Any]) -> str:
    horizons = [f"{h:g}" for h in table["horizons"]]
    marks = _edge_marks(table)
    lines = [
        "| method | "
        + " | ".join(f"{h}x loss (gap: last iterate / EMA)" for h in horizons)
        + " | compute (Chinchilla multiples) |",
        "| --- | " + " | ".join("---" for _ in horizons) + " | --- |",
    ]
    for label, row in table["rows"].items():
        cells = []
        for h in horizons:
            loss = row["loss"][h]
            if not math.isfinite(loss):
                cells.append("diverged" if row["diverged"].get(h) else "n/a")
                continue
            mark = marks.get((label, h), "")
            cells.append(f"{loss:.4f}{mark} ({row['gap_last'][h]:+.4f} / {row['gap_ema'][h]:+.4f})")
        compute = f"{row['compute']:g}" if row["compute"] else "-"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {compute} |")
    if marks:
        lines += ["", "\\* the best LR of this grid is at an edge the bound would not move."]
    notes = [f"- {label}: {row['note']}" for label, row in table["rows"].items() if row["note"]]
    if notes:
        lines += ["", "How each row ran:", "", *notes]
    return "\n".join(lines) + "\n"


def _edge_marks(table: dict[str, Any]) -> dict[tuple[str, str], str]:
    marks = {}
    for kind, scores in table["envelope_runs"].items():
        name = "cosine" if kind == "cosine" else "linear-to-zero"
        for h, best in scores["last"].items():
            if best["run"] is not None and not best["interior"]:
                marks[(f"{name} envelope (last iterate)", h)] = "*"
    return marks


def write_transfer_report(
    root: Path, study: TransferStudy, records: dict[str, Any], sweep_history: History
) -> dict[str, Any]:
    runs = {name: record.history for name, record in records.items()}
    table = transfer_table(study, runs, sweep_history)
    table["runs"] = run_table(records, study)
    forecast = read_forecast(root.parent, _launched_recipe_trial(root))
    if forecast is not None:
        table["forecast"] = forecast_cells(forecast, table)
    atomic_write_text(root / "transfer.json", strict_json(table))
    chosen_on = " (seed 0: the seed the grids chose on)" if table["seeds"] > 1 else ""
    atomic_write_text(
        root / "transfer.md",
        "# Transfer: validation loss per horizon, (gap to the envelope at the last iterate / "
        f"with each run's best EMA){chosen_on}\n\n"
        + _markdown(table)
        + ("\n" + seeds_markdown(table) if table["seeds"] > 1 else "")
        + ("\n" + head_to_head_markdown(table) if table["head_to_head"] else "")
        + ("\n" + forecast_markdown(table["forecast"], study.horizons) if forecast else ""),
    )
    seed_0 = {name: history for name, history in runs.items() if seed_of(name)[1] == 0}
    plot_losses(root / "loss_vs_tokens.png", study, seed_0, table)
    plot_gaps(root / "gap_vs_horizon.png", table)
    plot_lrs(root / "lr_curves.png", study, records)
    return table


def _launched_recipe_trial(root: Path) -> str | None:
    """The sweep trial the transfer took its recipe from (`launch.json`)."""
    try:
        return json.loads((root / "launch.json").read_text()).get("recipe_trial")
    except (OSError, ValueError):
        return None
