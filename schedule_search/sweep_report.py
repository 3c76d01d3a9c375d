"""`schedule-search report NAME`: a markdown report with plots of a sweep, from its folder.

Everything is read from the durable records (trials/<id>/metrics.json and windows.jsonl,
optuna.journal), so a report can be made while a sweep runs or after it died, without Ray.
Written into `runs/<name>/report/`:

    report.md              best trials, then every figure below with what it shows
    loss_vs_tokens.png     the objective per trial against tokens (log axis)
    lr_ema.png             LR per window per trial; raw weights vs each EMA for the best trial
    windows.png            micro-batches and tokens per window, grad norm, tokens/s over time
    importance.png         Optuna's parameter importances (fANOVA)
    parallel_coords.png    Optuna's parallel-coordinates view
    tensorboard/<id>/      TensorBoard event files: every window and evaluation of every trial
"""

from __future__ import annotations

import json
import math
import shutil
import warnings
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from schedule_search.checkpoint import atomic_write_text
from schedule_search.experiment import Experiment, TrialRow
from schedule_search.report import save_figure

TOP = 5


def read_windows(path: Path) -> list[dict[str, Any]]:
    """A trial's window log; a last line cut short by a kill is skipped."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _ranked(rows: list[TrialRow]) -> list[TrialRow]:
    """Furthest-reaching first, then lowest loss: a trial stopped at 1x cannot outrank one
    that reached the horizon with the same loss."""
    return sorted(
        rows,
        key=lambda r: (-r.chinchilla, r.val_loss if math.isfinite(r.val_loss) else math.inf),
    )


def _best_table(rows: list[TrialRow]) -> str:
    params = sorted({key for r in rows for key in r.params})
    header = ["trial", "state", "reached", "val_loss", "wall", *params]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for r in rows:
        values = [
            f"{r.params[p]:.4g}" if isinstance(r.params.get(p), float) else str(r.params.get(p))
            for p in params
        ]
        lines.append(
            f"| {r.trial_id} | {r.state} | {r.chinchilla:g}x | {r.val_loss:.4f} | "
            f"{r.wall_s:.0f} s | " + " | ".join(values) + " |"
        )
    return "\n".join(lines)


def _plot_losses(path: Path, experiment: Experiment, rows: list[TrialRow], best: str) -> None:
    figure, axis = plt.subplots(figsize=(8, 5))
    for r in rows:
        history = experiment.read_trial_json(r.trial_id, "metrics.json") or []
        if not history:
            continue
        emphasis = {"linewidth": 2.5, "zorder": 3} if r.trial_id == best else {"alpha": 0.6}
        axis.plot(
            [h["tokens"] for h in history],
            [h["val_loss"] for h in history],
            marker="o",
            label=f"{r.trial_id} ({r.state}, {r.chinchilla:g}x)",
            **emphasis,
        )
    axis.set_xscale("log")
    axis.set_xlabel("tokens")
    axis.set_ylabel("validation loss (objective)")
    axis.legend(fontsize=7)
    axis.grid(alpha=0.3)
    save_figure(figure, path)


def _cumulative_tokens(windows: list[dict[str, Any]]) -> list[int]:
    total, out = 0, []
    for w in windows:
        total += w["tokens"]
        out.append(total)
    return out


def _plot_lr_ema(path: Path, experiment: Experiment, rows: list[TrialRow], best: str) -> None:
    figure, (lr_axis, ema_axis) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in rows:
        windows = read_windows(experiment.trial_dir(r.trial_id) / "windows.jsonl")
        if windows:
            lr_axis.plot(
                _cumulative_tokens(windows),
                [w["lr"] for w in windows],
                label=r.trial_id,
                linewidth=2.5 if r.trial_id == best else 1,
            )
    lr_axis.set_xlabel("tokens")
    lr_axis.set_ylabel("learning rate (per window)")
    lr_axis.set_title("LR schedules")
    lr_axis.legend(fontsize=7)
    lr_axis.grid(alpha=0.3)
    history = experiment.read_trial_json(best, "metrics.json") or []
    keys = sorted({k for h in history for k in h if k.startswith("val_loss_")})
    for key in keys:
        label = "raw weights" if key == "val_loss_raw" else key.removeprefix("val_loss_")
        points = [(h["tokens"], h[key]) for h in history if key in h]
        ema_axis.plot(*zip(*points, strict=True), marker="o", label=label)
    ema_axis.set_xscale("log")
    ema_axis.set_xlabel("tokens")
    ema_axis.set_ylabel("validation loss")
    ema_axis.set_title(f"best trial {best}: raw weights vs EMAs (half-life = fraction x age)")
    ema_axis.legend(fontsize=8)
    ema_axis.grid(alpha=0.3)
    save_figure(figure, path)


def _plot_windows(path: Path, experiment: Experiment, rows: list[TrialRow], best: str) -> None:
    figure, axes = plt.subplots(2, 2, figsize=(12, 7), sharex=True)
    panels = (
        ("microbatches", "micro-batches per window"),
        ("tokens", "tokens per window"),
        ("grad_norm", "grad norm (before clipping)"),
        ("tokens_per_s", "tokens/s"),
    )
    for r in rows:
        windows = read_windows(experiment.trial_dir(r.trial_id) / "windows.jsonl")
        if not windows:
            continue
        start = windows[0]["wall_time"] - windows[0]["seconds"]
        elapsed = [w["wall_time"] - start for w in windows]
        for axis, (key, _) in zip(axes.flat, panels, strict=True):
            axis.plot(
                elapsed,
                [w[key] for w in windows],
                label=r.trial_id,
                linewidth=1.5 if r.trial_id == best else 0.7,
                alpha=1.0 if r.trial_id == best else 0.6,
            )
    for axis, (key, title) in zip(axes.flat, panels, strict=True):
        axis.set_title(title)
        axis.grid(alpha=0.3)
        if key == "grad_norm":
            axis.set_yscale("log")
    for axis in axes[1]:
        axis.set_xlabel("seconds since the trial's first window (per attempt)")
    axes[0][0].legend(fontsize=7)
    save_figure(figure, path)


def _optuna_figures(report_dir: Path, journal: Path) -> dict[str, str]:
    """Optuna's importance and parallel-coordinates plots; a reason instead where the study
    cannot support one (fewer than two finished trials, or no spread in the objective)."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    from optuna.visualization import matplotlib as optuna_plots

    done: dict[str, str] = {}
    if not journal.is_file():
        return {"importance.png": "no optuna.journal", "parallel_coords.png": "no optuna.journal"}
    storage = JournalStorage(JournalFileBackend(str(journal)))
    study = optuna.load_study(study_name=None, storage=storage)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    target = (lambda t: t.values[0]) if len(study.directions) > 1 else None
    target_name = "val_loss"
    for name, draw in (
        ("importance.png", optuna_plots.plot_param_importances),
        ("parallel_coords.png", optuna_plots.plot_parallel_coordinate),
    ):
        if len(complete) < 2:
            done[name] = f"needs two finished trials, the study has {len(complete)}"
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "experimental" notices
                axis = draw(study, target=target, target_name=target_name)
            figure = axis.figure if hasattr(axis, "figure") else axis[0].figure
            save_figure(figure, report_dir / name)
            done[name] = ""
        except (RuntimeError, ValueError, ZeroDivisionError) as err:
            done[name] = f"Optuna could not draw it: {err}"
    return done


def write_tensorboard(experiment: Experiment, out: Path) -> list[Path]:
    """TensorBoard event files, one folder per trial: every window (loss, grad norm, LR,
    micro-batches, tokens, tokens/s) and every evaluation (raw and EMA validation losses),
    all against tokens seen. Written anew from the durable records each time."""
    from tensorboardX import SummaryWriter

    shutil.rmtree(out, ignore_errors=True)
    folders = []
    for trial_id in experiment.trial_ids():
        windows = read_windows(experiment.trial_dir(trial_id) / "windows.jsonl")
        history = experiment.read_trial_json(trial_id, "metrics.json") or []
        if not windows and not history:
            continue
        folder = out / trial_id
        with SummaryWriter(logdir=str(folder)) as writer:
            for w, tokens in zip(windows, _cumulative_tokens(windows), strict=True):
                for key in ("loss", "grad_norm", "lr", "microbatches", "tokens", "tokens_per_s"):
                    writer.add_scalar(f"window/{key}", w[key], tokens, walltime=w["wall_time"])
            for h in history:
                for key, value in h.items():
                    if key.startswith("val_loss") and isinstance(value, float):
                        writer.add_scalar(f"eval/{key}", value, h["tokens"])
        folders.append(folder)
    return folders


def write_sweep_report(experiment: Experiment, horizon: float) -> Path:
    """Write the report of the sweep in `experiment`; returns the path of report.md."""
    report_dir = experiment.root / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    rows = [r for r in experiment.rows(horizon) if r.chinchilla > 0]
    ranked = _ranked(rows)
    best = ranked[0].trial_id if ranked else ""
    lines = [f"# Sweep `{experiment.root.name}`", ""]
    states: dict[str, int] = {}
    for r in experiment.rows(horizon):
        states[r.state] = states.get(r.state, 0) + 1
    lines.append(
        f"{sum(states.values())} trials ("
        + ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
        + f"); objective: validation loss at {horizon:g}x Chinchilla."
    )
    if not ranked:
        lines += ["", "No trial has reached its first evaluation yet."]
        atomic_write_text(report_dir / "report.md", "\n".join(lines) + "\n")
        return report_dir / "report.md"
    lines += ["", f"## Best trials (top {TOP})", "", _best_table(ranked[:TOP]), ""]
    _plot_losses(report_dir / "loss_vs_tokens.png", experiment, ranked, best)
    _plot_lr_ema(report_dir / "lr_ema.png", experiment, ranked, best)
    _plot_windows(report_dir / "windows.png", experiment, ranked, best)
    optuna_figures = _optuna_figures(report_dir, experiment.root / "optuna.journal")
    figures = [
        (
            "loss_vs_tokens.png",
            "Loss versus tokens",
            "The objective of every trial at each "
            "evaluation; the best trial is drawn thick. Trials ASHA stopped end early.",
        ),
        (
            "lr_ema.png",
            "LR and EMA curves",
            "Left: the LR each window stepped with. Right: the "
            "best trial's raw weights against each of its EMAs.",
        ),
        (
            "windows.png",
            "Window statistics",
            "Micro-batches and tokens per optimizer step, the "
            "gradient norm before clipping, and throughput, over each trial's time.",
        ),
        (
            "importance.png",
            "Parameter importance (Optuna, fANOVA)",
            "How much of the "
            "objective's spread each parameter explains, over finished and stopped trials.",
        ),
        (
            "parallel_coords.png",
            "Parallel coordinates (Optuna)",
            "Every trial's parameters, coloured by its objective.",
        ),
    ]
    for name, title, text in figures:
        lines += [f"## {title}", ""]
        reason = optuna_figures.get(name, "")
        lines.append(f"Not drawn: {reason}." if reason else f"{text}\n\n![{title}]({name})")
        lines.append("")
    tensorboard = write_tensorboard(experiment, report_dir / "tensorboard")
    lines += [
        "## TensorBoard",
        "",
        f"Event files for {len(tensorboard)} trials: "
        f"`tensorboard --logdir {report_dir / 'tensorboard'}` (every window and evaluation). "
        f"Tune's own per-evaluation events, written live: `tensorboard --logdir "
        f"{experiment.tune_dir}`.",
        "",
    ]
    transfer = experiment.root / "transfer" / "transfer.md"
    if transfer.is_file():
        lines += [
            "## Transfer",
            "",
            transfer.read_text().split("\n", 2)[-1].strip(),
            "",
            "Plots: `../transfer/loss_vs_tokens.png`, `../transfer/lr_curves.png`.",
            "",
        ]
    atomic_write_text(report_dir / "report.md", "\n".join(lines))
    return report_dir / "report.md"
