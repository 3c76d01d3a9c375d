"""`schedule-search report NAME`: a markdown report with plots of a sweep, from its folder.

Everything is read from the durable records (trials/<id>/config.json, metrics.json and
windows.jsonl), so a report can be made while a sweep runs or after it died, without Ray.
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

import math
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from schedule_search.core.averaging import fraction_label, loss_key
from schedule_search.core.files import atomic_write_text, read_jsonl
from schedule_search.core.states import State
from schedule_search.report.figures import plt, save_figure
from schedule_search.store.experiment import Experiment, TrialRow
from schedule_search.store.facts import read_facts
from schedule_search.store.records import read_records
from schedule_search.sweep.optuna_study import optuna_distributions
from schedule_search.sweep.space import FAMILY, SearchSpace, searched, value_text
from schedule_search.train.evaluation import Evaluation

__all__ = [
    "FEW_TRIALS",
    "FIGURES",
    "SMOOTHING",
    "TOP",
    "PlotRecords",
    "common_multiple",
    "load_records",
    "write_sweep_report",
    "write_tensorboard",
]

TOP = 5
SMOOTHING = 25


@dataclass
class PlotRecords:
    """What the report reads of one trial, read once: sampled params, evaluations, windows."""

    params: dict[str, Any]
    history: list[Evaluation]
    windows: list[dict[str, Any]]


def load_records(experiment: Experiment) -> dict[str, PlotRecords]:
    """Every trial's records but those of damaged trials (the CLI names them)."""
    out = {}
    for trial_id in experiment.trial_ids():
        recorded = read_records(experiment.trial_dir(trial_id))
        if recorded.problem is None:
            windows = read_jsonl(experiment.trial_dir(trial_id) / "windows.jsonl")
            out[trial_id] = PlotRecords(recorded.params, recorded.history, windows)
    return out


def _ranked(rows: list[TrialRow]) -> list[TrialRow]:
    """Furthest-reaching first, then lowest loss: a trial stopped at 1x cannot outrank one
    that reached the horizon with the same loss."""
    return sorted(
        rows,
        key=lambda r: (-r.chinchilla, r.val_loss if math.isfinite(r.val_loss) else math.inf),
    )


def _best_table(rows: list[TrialRow]) -> str:
    params = sorted({key for r in rows for key in r.params})
    header = ["trial", "state", "reached", "val_loss", "EMA fraction", "wall", *params]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for r in rows:
        values = [value_text(r.params.get(p)) for p in params]
        lines.append(
            f"| {r.trial_id} | {r.state} | {r.chinchilla:g}x | {r.val_loss:.4f} | "
            f"{fraction_label(r.ema_fraction)} | {r.wall_s:.0f} s | " + " | ".join(values) + " |"
        )
    return "\n".join(lines)


def _plot_losses(
    path: Path, records: dict[str, PlotRecords], rows: list[TrialRow], best: str
) -> None:
    figure, axis = plt.subplots(figsize=(8, 5))
    for r in rows:
        history = records[r.trial_id].history
        if not history:
            continue
        emphasis: dict[str, Any] = (
            {"linewidth": 2.5, "zorder": 3} if r.trial_id == best else {"alpha": 0.6}
        )
        axis.plot(
            [h.tokens for h in history],
            [h.val_loss for h in history],
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


def _plot_lr_ema(
    path: Path, records: dict[str, PlotRecords], rows: list[TrialRow], best: str
) -> None:
    figure, (lr_axis, ema_axis) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in rows:
        windows = records[r.trial_id].windows
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
    history = records[best].history
    for fraction in sorted({f for h in history for f in h.losses}):
        label = "raw weights" if fraction == 0 else f"ema/{fraction:g}"
        points = [(h.tokens, h.losses[fraction]) for h in history if fraction in h.losses]
        ema_axis.plot(*zip(*points, strict=True), marker="o", label=label)
    ema_axis.set_xscale("log")
    ema_axis.set_xlabel("tokens")
    ema_axis.set_ylabel("validation loss")
    ema_axis.set_title(f"best trial {best}: raw weights vs EMAs (half-life = fraction x age)")
    ema_axis.legend(fontsize=8)
    ema_axis.grid(alpha=0.3)
    save_figure(figure, path)


def _rolling_mean(values: list[float], n: int) -> list[float]:
    """Mean over the last `n` values (fewer at the start): per-window tokens/s is too noisy to
    read raw at millisecond windows."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value - (values[i - n] if i >= n else 0.0)
        out.append(total / min(i + 1, n))
    return out


def _plot_windows(
    path: Path, records: dict[str, PlotRecords], rows: list[TrialRow], best: str
) -> None:
    figure, axes = plt.subplots(2, 2, figsize=(12, 7), sharex=True)
    panels = (
        ("microbatches", "micro-batches per window (summed over ranks)"),
        ("tokens", "tokens per window (summed over ranks)"),
        ("grad_norm", "grad norm (before clipping)"),
        ("tokens_per_s", f"tokens/s (mean over {SMOOTHING} windows)"),
    )
    dashes = ("-", "--", ":", "-.")  # trials with equal windows draw on top of each other
    for i, r in enumerate(rows):
        windows = records[r.trial_id].windows
        if not windows:
            continue
        start = windows[0]["wall_time"] - windows[0]["seconds"]
        elapsed = [w["wall_time"] - start for w in windows]
        for axis, (key, _) in zip(axes.flat, panels, strict=True):
            values = [w[key] for w in windows]
            axis.plot(
                elapsed,
                _rolling_mean(values, SMOOTHING) if key == "tokens_per_s" else values,
                label=r.trial_id,
                linestyle=dashes[i % len(dashes)],
                linewidth=1.5 if r.trial_id == best else 0.9,
                alpha=1.0 if r.trial_id == best else 0.7,
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


def common_multiple(histories: dict[str, list[Evaluation]]) -> float | None:
    """The largest Chinchilla multiple at which every trial was evaluated: the one point where
    trials stopped early and trials that ran on compare like for like."""
    reached = [{h.chinchilla for h in history} for history in histories.values() if history]
    shared = set.intersection(*reached) if reached else set()
    return max(shared) if shared else None


def _optuna_figures(
    report_dir: Path, records: dict[str, PlotRecords], space: SearchSpace
) -> tuple[dict[str, str], float | None]:
    """Optuna's importance and parallel-coordinates plots of an in-memory study whose values
    are the losses at the common multiple (a trial stopped at 1x and one that ran to 4x are
    compared at 1x). A reason instead of a plot where the trials cannot support one."""
    import optuna
    from optuna.trial import create_trial
    from optuna.visualization import matplotlib as optuna_plots

    multiple = common_multiple({t: r.history for t, r in records.items()})
    distributions = optuna_distributions(space)
    study = optuna.create_study(direction="minimize")
    for trial in records.values():
        loss = next((h.val_loss for h in trial.history if h.chinchilla == multiple), math.nan)
        names = set(searched(space, trial.params.get(FAMILY)))
        if math.isfinite(loss) and set(trial.params) == names:
            own = {name: distributions[name] for name in names}
            study.add_trial(create_trial(value=loss, params=trial.params, distributions=own))
    reasons: dict[str, str] = {}
    for name, draw, size in (
        ("importance.png", optuna_plots.plot_param_importances, (8, 4.5)),
        ("parallel_coords.png", optuna_plots.plot_parallel_coordinate, (12, 5)),
    ):
        if len(study.trials) < 2:
            reasons[name] = (
                f"needs two trials evaluated at a common multiple, has {len(study.trials)}"
            )
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna's "experimental" notices
                axis = draw(study, target_name=f"val_loss at {multiple:g}x")
        except (RuntimeError, ValueError, ZeroDivisionError) as err:
            reasons[name] = f"Optuna could not draw it: {err}"
            continue
        if name == "parallel_coords.png":
            _visible_on_grey(axis)
        elif len(study.trials) < FEW_TRIALS:
            hint = f"{len(study.trials)} trials: a hint, not a verdict"
            axis.set_title(f"{axis.get_title()} - {hint}")
        figure = axis.figure
        assert isinstance(figure, Figure)  # Optuna's plots draw on a figure of their own
        figure.set_size_inches(*size)
        save_figure(figure, report_dir / name)
        reasons[name] = ""
    return reasons, multiple


#: Below this many trials fANOVA's importances move a lot with one more trial.
FEW_TRIALS = 20


def _visible_on_grey(axis) -> None:
    """Optuna colours parallel coordinates with Blues, whose worst end is white on its grey
    background; viridis keeps both ends visible (the colour bar follows)."""
    from matplotlib.collections import LineCollection

    for collection in axis.collections:
        if isinstance(collection, LineCollection):
            collection.set_cmap("viridis")


def write_tensorboard(records: dict[str, PlotRecords], out: Path) -> list[Path]:
    """TensorBoard event files, one folder per trial: every window (loss, grad norm, LR,
    micro-batches, tokens, tokens/s) and every evaluation (raw and EMA validation losses),
    all against tokens seen. Written anew from the durable records each time."""
    from tensorboardX import SummaryWriter

    shutil.rmtree(out, ignore_errors=True)
    folders = []
    for trial_id, trial in records.items():
        windows, history = trial.windows, trial.history
        if not windows and not history:
            continue
        folder = out / trial_id
        with SummaryWriter(logdir=str(folder)) as writer:
            for w, tokens in zip(windows, _cumulative_tokens(windows), strict=True):
                for key in ("loss", "grad_norm", "lr", "microbatches", "tokens", "tokens_per_s"):
                    writer.add_scalar(f"window/{key}", w[key], tokens, walltime=w["wall_time"])
            for h in history:
                writer.add_scalar("eval/val_loss", h.val_loss, h.tokens)
                for fraction, loss in h.losses.items():
                    writer.add_scalar(f"eval/{loss_key(fraction)}", loss, h.tokens)
        folders.append(folder)
    return folders


FIGURES = (  # file, title, what it shows ({m}: the common multiple of the Optuna views)
    (
        "loss_vs_tokens.png",
        "Loss versus tokens",
        "The objective of every trial at each evaluation; the best trial is drawn thick. "
        "Trials ASHA stopped end early.",
    ),
    (
        "lr_ema.png",
        "LR and EMA curves",
        "Left: the LR each window stepped with. Right: the best trial's raw weights against "
        "each of its EMAs.",
    ),
    (
        "windows.png",
        "Window statistics",
        "Micro-batches and tokens per optimizer step, the gradient norm before clipping, and "
        "throughput, over each trial's time.",
    ),
    (
        "importance.png",
        "Parameter importance (Optuna, fANOVA)",
        "How much of the spread of the loss at {m}x each parameter explains; {m}x is the "
        "largest multiple every trial reached, so trials stopped early compare like for like. "
        f"With fewer than {FEW_TRIALS} trials it is a hint: one more trial can reorder it.",
    ),
    (
        "parallel_coords.png",
        "Parallel coordinates (Optuna)",
        "Every trial's parameters, coloured by its loss at {m}x.",
    ),
)


def _summary(rows: list[TrialRow], horizon: float) -> str:
    states: dict[State, int] = {}
    for r in rows:
        states[r.state] = states.get(r.state, 0) + 1
    counts = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    return (
        f"{sum(states.values())} trials ({counts}); objective: validation loss at "
        f"{horizon:g}x Chinchilla."
    )


def write_sweep_report(experiment: Experiment, space: SearchSpace) -> Path:
    """Write the report of the sweep in `experiment`; returns the path of report.md."""
    horizon = read_facts(experiment.root).horizon
    report_dir = experiment.root / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    rows = experiment.rows()
    ranked = _ranked([r for r in rows if r.chinchilla > 0])
    lines = [f"# Sweep `{experiment.root.name}`", "", _summary(rows, horizon), ""]
    if not ranked:
        lines.append("No trial has reached its first evaluation yet.")
        atomic_write_text(report_dir / "report.md", "\n".join(lines) + "\n")
        return report_dir / "report.md"
    best = ranked[0].trial_id
    lines += [f"## Best trials (top {TOP})", "", _best_table(ranked[:TOP]), ""]
    records = load_records(experiment)
    _plot_losses(report_dir / "loss_vs_tokens.png", records, ranked, best)
    _plot_lr_ema(report_dir / "lr_ema.png", records, ranked, best)
    _plot_windows(report_dir / "windows.png", records, ranked, best)
    not_drawn, multiple = _optuna_figures(report_dir, records, space)
    for name, title, text in FIGURES:
        reason = not_drawn.get(name)
        body = f"Not drawn: {reason}." if reason else text.format(m=f"{multiple or 0:g}")
        lines += [f"## {title}", "", body, "", *([f"![{title}]({name})", ""] if not reason else [])]
    tensorboard = report_dir / "tensorboard"
    lines += [
        "## TensorBoard",
        "",
        f"Event files for {len(write_tensorboard(records, tensorboard))} trials, every "
        f"window and evaluation: `tensorboard --logdir {tensorboard}`. Tune's own "
        f"per-evaluation events, written live: `tensorboard --logdir {experiment.tune_dir}`.",
        "",
    ]
    transfer = experiment.root / "transfer" / "transfer.md"
    if transfer.is_file():
        table = transfer.read_text().split("\n", 2)[-1].strip()
        lines += ["## Transfer", "", table, "", "Plots: `../transfer/*.png`.", ""]
    atomic_write_text(report_dir / "report.md", "\n".join(lines))
    return report_dir / "report.md"
