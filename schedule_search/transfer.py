"""Transfer: run the exported recipe to longer horizons, against a cosine envelope and WSD.

One anytime run of the recipe to the largest multiple, evaluated at every multiple on the way;
beside it, for comparison, constant + EMA and poly (1/sqrt) + EMA at the recipe's LR. The
baselines: cosine with T at each horizon over an LR grid around the recipe's LR (the envelope is
the best per horizon), and WSD branched from the constant run's checkpoint at 90% of each
horizon, decaying linearly to 10% of peak, evaluated at the last iterate.

Phase 1 runs everything that starts from scratch; phase 2 the WSD branches, which need the
constant run's checkpoints. Both are Tune experiments of core-trainer trials (the sweep's own
machinery), so a killed transfer resumes without redoing finished runs.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedule_search import checkpoint as ckpt
from schedule_search.clock import Horizon
from schedule_search.config import ConfigError, parse, to_dict
from schedule_search.experiment import Experiment, SweepSettings
from schedule_search.train import TrainConfig

METHODS = ("recipe", "constant", "poly", "cosine", "wsd")
LR_GRID = (0.5, 1.0, 2.0)
WSD_BRANCH = 0.9  # branch at 90% of the horizon, decay over the last 10%
FLOOR = 0.1


@dataclass
class TransferPlan:
    """Everything a transfer runs, by name, and the horizons it reports."""

    horizons: list[float]
    runs: dict[str, dict[str, Any]]  # name -> TrainConfig as a dict
    branches: dict[str, float]  # WSD run name -> its horizon
    same_as: dict[str, str] = field(default_factory=dict)  # a method -> the run it would repeat


def recipe_config(sweep: Experiment) -> tuple[TrainConfig, str]:
    """The full training config of the trial the sweep exported (or would export)."""
    recipe_path = sweep.root / "recipe.yaml"
    if recipe_path.is_file():
        from schedule_search.recipe import load_recipe

        trial_id = load_recipe(recipe_path).spec.source["trial_id"]
    else:
        best = sweep.best(_sweep_horizon(sweep))
        if best is None:
            raise ConfigError(
                f"{sweep.root}: no trial has reached the horizon; nothing to transfer"
            )
        trial_id = best.trial_id
    record = sweep.read_trial_json(trial_id, "config.json")
    if record is None:
        raise ConfigError(f"{sweep.root}: trial {trial_id} of the recipe has no config.json")
    return parse(TrainConfig, record["config"], f"trial {trial_id}"), trial_id


def transfer_base(sweep: Experiment, workers: int) -> tuple[TrainConfig, str]:
    """The recipe's config for runs on `workers` workers. A window of micro-batches is counted
    per rank, so on another number of workers it is rescaled to keep the recipe's tokens per
    optimizer step (its batch size, which its LR was tuned for)."""
    base, trial_id = recipe_config(sweep)
    tuned_on = sweep.settings().workers
    if workers == tuned_on or base.window.policy != "microbatches":
        return base, trial_id
    total = base.window.microbatches * tuned_on
    if total % workers:
        raise ConfigError(
            f"--workers {workers}: the recipe steps every {total} micro-batches "
            f"({base.window.microbatches} per rank on {tuned_on} workers), which {workers} "
            "workers cannot split evenly"
        )
    tree = to_dict(base)
    tree["window"]["microbatches"] = total // workers
    return parse(TrainConfig, tree, f"trial {trial_id} on {workers} workers"), trial_id


def _sweep_horizon(sweep: Experiment) -> float:
    from schedule_search.space import load_space, trial_config

    return trial_config(load_space(sweep.root / "space.yaml"), {}).budget.horizon


def _milestones(horizons: list[float], up_to: float, extra: list[float] = ()) -> list[float]:
    points, m = set(extra), 0.25
    while m < up_to:
        points.add(m)
        m *= 2
    points |= {h for h in horizons if h < up_to}
    return sorted(p for p in points if p < up_to)


def plan(
    base: TrainConfig, horizons: list[float], methods: list[str], lr_grid=LR_GRID
) -> TransferPlan:
    """The runs of a transfer study from the recipe's config `base`."""
    top = max(horizons)
    tree = to_dict(base)
    tree["branch_from"] = None
    fractions = sorted(set(tree["ema"]["fractions"]) | {0.0})
    tree["ema"]["fractions"] = fractions

    def variant(**changes: Any) -> dict[str, Any]:
        run = copy.deepcopy(tree)
        for section, values in changes.items():
            if isinstance(values, dict):
                run[section].update(values)
            else:
                run[section] = values
        return run

    anytime_budget = {"horizon": top, "eval_at": _milestones(horizons, top)}
    runs: dict[str, dict[str, Any]] = {}
    if "recipe" in methods:
        runs["recipe"] = variant(budget=anytime_budget)
    if "constant" in methods or "wsd" in methods:
        branch_points = [WSD_BRANCH * h for h in horizons] if "wsd" in methods else []
        runs["constant"] = variant(
            schedule={"kind": "constant"},
            budget={"horizon": top, "eval_at": _milestones(horizons, top, branch_points)},
            checkpoint={"keep": 10_000, "every_windows": 0},  # the WSD branch points stay
        )
    if "poly" in methods:
        runs["poly"] = variant(schedule={"kind": "poly", "gamma": 0.5}, budget=anytime_budget)
    if "cosine" in methods:
        for h in horizons:
            for factor in lr_grid:
                runs[f"cosine-{h:g}x-lr{factor:g}"] = variant(
                    schedule={"kind": "cosine", "horizon": h, "floor": FLOOR},
                    optimizer={"lr": base.optimizer.lr * factor},
                    ema={"fractions": [0.0], "objective": 0.0},
                    budget={"horizon": h, "eval_at": _milestones(horizons, h)},
                )
    same_as = {}
    if runs.get("poly") is not None and runs.get("poly") == runs.get("recipe"):
        same_as["poly"] = "recipe"  # the recipe is 1/sqrt + EMA itself: run it once
        del runs["poly"]
    branches = {f"wsd-{h:g}x": h for h in horizons} if "wsd" in methods else {}
    for name, config in runs.items():  # validate now, not inside a trial
        parse(TrainConfig, config, f"transfer run {name}")
    return TransferPlan(sorted(horizons), runs, branches, same_as)


def branch_config(plan_: TransferPlan, name: str, trunk_checkpoint: Path) -> dict[str, Any]:
    h = plan_.branches[name]
    run = copy.deepcopy(plan_.runs["constant"])
    run["schedule"].update(kind="wsd", horizon=h, decay_fraction=1 - WSD_BRANCH, floor=FLOOR)
    run["ema"]["objective"] = 0.0  # WSD is evaluated at the last iterate
    run["budget"].update(horizon=h, eval_at=[])
    run["checkpoint"] = {"keep": 2, "every_windows": 0}
    run["branch_from"] = str(trunk_checkpoint)
    return run


def trunk_checkpoint(transfer: Experiment, constant_trial: str, tokens: int) -> Path:
    """The constant run's first checkpoint at or after `tokens` (its evaluation at 0.9 h)."""
    folders = ckpt.checkpoint_folders(transfer.train_run_dir(constant_trial))
    for folder in folders:
        if int(folder.name.removeprefix(ckpt.PREFIX)) >= tokens:
            return folder
    raise RuntimeError(f"the constant run has no checkpoint at or after {tokens} tokens")


class PlannedRuns:
    """Resolves a transfer trial's `run` name into its config."""

    def __init__(self, runs: dict[str, dict[str, Any]]) -> None:
        self.runs = runs

    def __call__(self, params: dict[str, Any], trial_id: str) -> TrainConfig:
        return parse(TrainConfig, self.runs[params["run"]], f"transfer run {params['run']}")


def run_names(transfer: Experiment) -> dict[str, str]:
    """run name -> trial id, for runs that have a trial folder."""
    names = {}
    for trial_id in transfer.trial_ids():
        params = (transfer.read_trial_json(trial_id, "config.json") or {}).get("params", {})
        if "run" in params:
            names[params["run"]] = trial_id
    return names


def run_transfer(
    sweep: Experiment,
    settings: SweepSettings,
    horizons: list[float],
    methods: list[str],
    resume: bool,
) -> Path:
    """Run (or resume) the transfer study of `sweep`; returns the folder of its results."""
    from ray import tune

    from schedule_search.search import ray_session, run_tune

    base, trial_id = transfer_base(sweep, settings.workers)
    plan_ = plan(base, horizons, methods)
    root = sweep.root / "transfer"
    phases = [Experiment(root / "phase1"), Experiment(root / "phase2")]
    root.mkdir(parents=True, exist_ok=True)
    ckpt.atomic_write_text(
        root / "plan.json",
        json.dumps(
            {
                "recipe_trial": trial_id,
                "horizons": horizons,
                "to": [h for h in horizons if h != base.budget.horizon],
                "methods": methods,
                "workers": settings.workers,
                "concurrency": settings.concurrency,
            },
            indent=1,
        ),
    )
    with ray_session(settings):
        first = phases[0]
        # Longest runs first: with runs in parallel, a long run started last would train alone.
        names = sorted(plan_.runs, key=lambda n: -plan_.runs[n]["budget"]["horizon"])
        done = {r.trial_id for r in first.rows(0) if r.state != "running"}
        if len(done) < len(names) or not resume:
            run_tune(
                first,
                settings,
                PlannedRuns(plan_.runs),
                tune.TuneConfig(max_concurrent_trials=settings.concurrency),
                {"run": tune.grid_search(names)},
                _live_view({n: (0.0, plan_.runs[n]["budget"]["horizon"]) for n in names}),
                resume,
            )
        _require_finished(first, names)
        if plan_.branches:
            constant = run_names(first)["constant"]
            branch_runs = {}
            for name, h in plan_.branches.items():
                horizon = Horizon(**_horizon_of(first, constant, base))
                folder = trunk_checkpoint(first, constant, horizon.tokens(WSD_BRANCH * h))
                branch_runs[name] = branch_config(plan_, name, folder)
            run_tune(
                phases[1],
                settings,
                PlannedRuns(branch_runs),
                tune.TuneConfig(max_concurrent_trials=settings.concurrency),
                {"run": tune.grid_search(list(branch_runs))},
                _live_view({n: (WSD_BRANCH * h, h) for n, h in plan_.branches.items()}),
                resume or phases[1].tune_dir.exists(),
            )
        _require_finished(phases[1], list(plan_.branches))
    from schedule_search.report import write_transfer_report

    write_transfer_report(root, plan_, phases, base)
    return root


class Unfinished(Exception):
    """The transfer stopped with runs unfinished (interrupted, or a run failed for good)."""


def _require_finished(phase: Experiment, names: list[str]) -> None:
    """Tune returns on Ctrl-C too: go on to the branches or the report only when every run of
    the phase has ended."""
    trial_ids = run_names(phase)
    unfinished = [
        n
        for n in names
        if n not in trial_ids or not phase.read_trial_json(trial_ids[n], "result.json")
    ]
    if unfinished:
        raise Unfinished(
            f"{len(unfinished)} of {len(names)} runs of {phase.root.name} unfinished "
            f"({', '.join(unfinished[:4])}{', ...' if len(unfinished) > 4 else ''})"
        )


def _live_view(spans: dict[str, tuple[float, float]]):
    """The progress view of one phase: its runs and the Chinchilla multiples each trains over."""
    from schedule_search.progress import LiveView

    return LiveView(
        len(spans), sum(end - start for start, end in spans.values()), lambda p: spans[p["run"]]
    )


def _horizon_of(experiment: Experiment, trial_id: str, base: TrainConfig) -> dict[str, Any]:
    last = experiment.read_trial_json(trial_id, "metrics.json")[-1]
    return {
        "n_params": int(last["n_params"]),
        "tokens_per_param": base.budget.tokens_per_param,
        "tokens_per_reference_step": float(last["tokens_per_reference_step"]),
    }


def histories(phases: list[Experiment]) -> dict[str, list[dict[str, Any]]]:
    """run name -> its evaluation history, over both phases."""
    out = {}
    for phase in phases:
        for name, trial_id in run_names(phase).items():
            out[name] = phase.read_trial_json(trial_id, "metrics.json") or []
    return out


def loss_at(history: list[dict[str, Any]], multiple: float, key: str = "val_loss") -> float:
    for row in history:
        if math.isclose(row["chinchilla"], multiple):
            return row.get(key, math.nan)
    return math.nan
