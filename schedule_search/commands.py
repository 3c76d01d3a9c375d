"""What each verb of the CLI does (`cli` parses the command line and dispatches here): every
handler takes the parsed arguments and returns the exit code; bad input is a ConfigError."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from schedule_search.core.config import ConfigError, InputWarning
from schedule_search.core.states import State
from schedule_search.store.lock import experiment_lock

__all__ = ["EXIT_UNFINISHED", "export", "report", "resume", "status", "sweep", "train", "transfer"]

if TYPE_CHECKING:
    from schedule_search.store.experiment import SweepSettings
    from schedule_search.store.facts import SweepFacts
    from schedule_search.sweep.space import SearchSpace

EXIT_UNFINISHED = 1


def _again(verb: str, name: str, storage: Path | None) -> str:
    """A command the user can paste to run `verb` on `name`: the program as they ran it
    (`schedule-search` only when that is what their shell finds), with their --storage."""
    import shlex
    import shutil

    ran = Path(sys.argv[0])
    if ran.name == "schedule-search":
        found = shutil.which("schedule-search")
        program = (
            "schedule-search" if found and Path(found).resolve() == ran.resolve() else str(ran)
        )
    else:  # python -m schedule_search.cli
        program = f"{Path(sys.executable).name} -m schedule_search.cli"
    parts = [program, verb, name] + (["--storage", str(storage)] if storage else [])
    return " ".join(shlex.quote(part) if part != program else part for part in parts)


def _prepare_space(args: argparse.Namespace) -> tuple[dict, SearchSpace, SweepFacts]:
    """The space with the command line's overrides applied, validated, and what it resolves
    to (`SweepFacts`); nothing written yet."""
    import tempfile

    import yaml

    from schedule_search.core.config import load_yaml
    from schedule_search.sweep.horizon import check_own_horizons, set_horizon
    from schedule_search.sweep.resolve import resolve_facts
    from schedule_search.sweep.space import load_space

    data = load_yaml(args.space)
    if not isinstance(data, dict):
        raise ConfigError(f"{args.space}: expected a mapping of keys, got {type(data).__name__}")
    if args.samples is not None:
        data["samples"] = args.samples
    if args.seed is not None:
        data["seed"] = args.seed
    if args.horizon is not None:
        set_horizon(data, args.horizon)
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / args.space.name
        copy.write_text(yaml.safe_dump(data, sort_keys=False))
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always", InputWarning)
                space = load_space(copy)
                check_own_horizons(space, str(copy))
                facts = resolve_facts(space, str(copy))
        except ConfigError as err:
            raise ConfigError(str(err).replace(str(copy), str(args.space))) from None
    shown = set()  # the space's check and its facts both build the task: one warning each
    for warning in seen:  # shown with the user's file, not the scratch copy
        text = str(warning.message).replace(str(copy), str(args.space))
        if text not in shown:
            shown.add(text)
            warnings.warn_explicit(text, warning.category, warning.filename, warning.lineno)
    return data, space, facts


def sweep(args: argparse.Namespace) -> int:
    import yaml

    from schedule_search.core.files import atomic_write_text
    from schedule_search.store.experiment import Experiment
    from schedule_search.store.facts import write_facts
    from schedule_search.sweep import driver  # noqa: F401  (Ray and Optuna: before any write)
    from schedule_search.sweep.resources import available, check_resources, default_concurrency
    from schedule_search.sweep.space import shardings
    from schedule_search.train.config import check_workers

    data, space, facts = _prepare_space(args)
    name = args.name or space.name
    experiment = Experiment.named(name, args.storage)
    if (experiment.root / "sweep.json").exists():
        raise ConfigError(
            f"{experiment.root}: experiment exists; `{_again('resume', name, args.storage)}` "
            "continues it"
        )
    settings = _settings(args, data, name)
    for sharding in shardings(space):  # bad input is refused before Ray is asked anything
        check_workers(sharding, settings.workers, str(args.space))
    has = available(settings.address)
    if args.concurrency is None:
        settings = dataclasses.replace(settings, concurrency=default_concurrency(settings, has))
    check_resources(settings, has)  # before any write: a trial that cannot fit waits forever
    with experiment_lock(experiment.root, "sweep"):
        if (experiment.root / "sweep.json").exists():  # another sweep got here first
            raise ConfigError(f"{experiment.root}: experiment exists")
        atomic_write_text(experiment.root / "space.yaml", yaml.safe_dump(data, sort_keys=False))
        write_facts(experiment.root, facts)
        experiment.save_settings(settings)  # last: from here on the experiment exists
        return _run(settings, experiment, args.storage, resume=False)


def _settings(args: argparse.Namespace, data: dict, name: str) -> SweepSettings:
    """How the sweep launches (saved in sweep.json so `resume` launches it the same way); its
    concurrency, where `--concurrency` is not given, is set once the machine or cluster it
    launches on has been asked what it has (`sweep`)."""
    from schedule_search.store.experiment import SweepSettings

    return SweepSettings(
        name=name,
        samples=int(data.get("samples", 8)),
        workers=args.workers,
        concurrency=args.concurrency or 1,
        gpus_per_worker=args.gpus_per_worker,
        address=args.address or os.environ.get("RAY_ADDRESS"),
        max_failures=args.max_failures,
    )


def _run(settings, experiment, storage: Path | None, resume: bool) -> int:
    from schedule_search.core.interrupts import Interrupted
    from schedule_search.sweep.driver import sweep
    from schedule_search.sweep.failures import TrialsFailed

    try:
        sweep(settings, experiment, resume=resume)
    except TrialsFailed as err:
        print(
            f"sweep ended: {err}{_continues(err, 'resume', experiment.root.name, storage)}",
            file=sys.stderr,
        )
        return EXIT_UNFINISHED
    except Interrupted as stop:
        again = _again("resume", experiment.root.name, storage)
        print(
            f"sweep stopped by {stop}, its trials checkpointed; `{again}` continues it",
            file=sys.stderr,
        )
        return stop.exit_code
    _print_table(experiment)
    return 0


def _continues(err: Exception, verb: str, name: str, storage: Path | None) -> str:
    """What to run once Ray starts (or the cluster is reachable) again, for a run that ended
    before Ray ran it (its folder is kept); nothing for a run whose trials failed."""
    from schedule_search.sweep.ray_env import RayNotStarted

    if not isinstance(err, RayNotStarted):
        return ""
    return f"; `{_again(verb, name, storage)}` continues it"


def resume(args: argparse.Namespace) -> int:
    from schedule_search.store.experiment import Experiment
    from schedule_search.sweep.resources import check_resources

    experiment = Experiment.named(args.name, args.storage)
    settings = experiment.settings()
    check_resources(settings)
    with experiment_lock(experiment.root, "resume"):
        return _run(settings, experiment, args.storage, resume=True)


def _recorded_space(experiment):
    """The experiment's own copy of its space, read without building its task."""
    from schedule_search.sweep.space import load_space

    return load_space(experiment.root / "space.yaml", check_task=False)


def _horizon(experiment) -> float:
    from schedule_search.store.facts import read_facts

    return read_facts(experiment.root).horizon


def _warn_damaged(experiment) -> None:
    for problem in experiment.problems():
        print(f"warning: {problem}; that trial is left out", file=sys.stderr)


def _print_table(experiment) -> None:
    from rich.console import Console

    from schedule_search.report.trials_table import trials_table

    _warn_damaged(experiment)
    try:
        rows = experiment.write_table()
        written = f"table: {experiment.root / 'trials.csv'}"
    except OSError as error:  # a full or read-only volume: the records still read
        rows = experiment.rows()
        written = f"table not written: {error}"
    table = trials_table(experiment, rows, _horizon(experiment))
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    print(written)


def transfer(args: argparse.Namespace) -> int:
    from schedule_search.core.interrupts import Interrupted
    from schedule_search.report.transfer import write_transfer_report
    from schedule_search.store.experiment import Experiment
    from schedule_search.sweep import driver  # noqa: F401  (Ray and Optuna: before any write)
    from schedule_search.sweep.failures import TrialsFailed
    from schedule_search.sweep.resources import check_resources
    from schedule_search.transfer.launch import plan_launch
    from schedule_search.transfer.run import Unfinished, run_transfer

    sweep = Experiment.named(args.name, args.storage)
    launch = plan_launch(
        sweep, args.to, args.methods, args.workers, args.concurrency, args.seeds, args.reuse
    )
    check_resources(launch.settings)
    again = _again("transfer", args.name, args.storage)
    with experiment_lock(sweep.root, "transfer"):
        try:
            outcome = run_transfer(
                sweep,
                launch.settings,
                launch.horizons,
                launch.methods,
                launch.resume,
                launch.seeds,
                launch.constant_lr,
                launch.reuse,
            )
        except TrialsFailed as err:
            hint = _continues(err, "transfer", args.name, args.storage)
            print(f"transfer ended: {err}{hint}", file=sys.stderr)
            return EXIT_UNFINISHED
        except Interrupted as stop:
            print(f"transfer stopped by {stop}; `{again}` resumes it", file=sys.stderr)
            return stop.exit_code
        except Unfinished as err:
            print(f"transfer stopped: {err}; `{again}` resumes it", file=sys.stderr)
            return EXIT_UNFINISHED
        root = outcome.root
        write_transfer_report(root, outcome.study, outcome.records, outcome.sweep_history)
    print((root / "transfer.md").read_text())
    print(f"table, JSON and plots in {root}")
    return 0


def status(args: argparse.Namespace) -> int:
    from schedule_search.store.experiment import Experiment

    experiment = Experiment.named(args.name, args.storage)
    experiment.settings()  # a clear error when there is no such sweep
    _print_table(experiment)
    if (experiment.root / "transfer" / "launch.json").exists():
        _print_transfer(experiment.root, _again("transfer", args.name, args.storage))
    return 0


def _print_transfer(root: Path, again: str) -> None:
    from rich.console import Console

    from schedule_search.report.transfer_status import transfer_status

    try:
        summary, table = transfer_status(root, again)
    except (OSError, ValueError) as err:  # the sweep's table stands; say what is unreadable
        print(f"transfer: {root / 'transfer'}: unreadable ({err})", file=sys.stderr)
        return
    print(summary)
    Console(width=None if sys.stdout.isatty() else 160).print(table)


def export(args: argparse.Namespace) -> int:
    from schedule_search.core.averaging import fraction_label
    from schedule_search.core.files import require_placeable
    from schedule_search.recipe.export import export_best
    from schedule_search.store.experiment import Experiment
    from schedule_search.store.facts import read_facts

    experiment = Experiment.named(args.name, args.storage)
    experiment.settings()
    output = args.output or experiment.root / "recipe.yaml"
    require_placeable(output, "--output")
    facts = read_facts(experiment.root)
    best, spec = export_best(experiment, output, facts, args.max_slowdown, args.at, args.within)
    picked = f"val_loss {best.val_loss:.4f} at {best.chinchilla:g}x"
    if args.at is not None:
        forecast = spec.objective["forecast"]
        picked = (
            f"forecast val_loss {forecast['loss']:.4f} [{forecast['low']:.4f}, "
            f"{forecast['high']:.4f}] at {args.at:g}x by its own curve; {picked}; best at "
            f"{facts.horizon:g}x: trial {forecast['best_at_sweep_horizon']}"
        )
    ema = fraction_label(best.ema_fraction)
    print(f"trial {best.trial_id}: {picked} (EMA fraction {ema}) -> {output}")
    return 0


def forecast(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from schedule_search.forecast import forecast_sweep, write_forecast
    from schedule_search.forecast.predict import INTERVALS, METHODS
    from schedule_search.recipe.export import exported_trial
    from schedule_search.store.experiment import Experiment
    from schedule_search.store.facts import read_facts
    from schedule_search.transfer.lr_grid import reach
    from schedule_search.transfer.plan import constant_lr_of

    experiment = Experiment.named(args.name, args.storage)
    experiment.settings()
    facts = read_facts(experiment.root)
    facts.check_beyond(args.to or [])
    horizon = facts.horizon
    recipe_trial, _ = exported_trial(experiment)
    horizons = [horizon, *(h for h in (args.to or [8.0, 16.0, 32.0]) if h > horizon)]
    # Constant + EMA where its transfer trains it: at the LR its grid picks (the rule a
    # transfer launched now takes), or at the recipe's (one launched before that rule).
    tuned = constant_lr_of(experiment.root / "transfer" / "launch.json") == "tuned"
    methods = args.methods or METHODS
    predicted = forecast_sweep(
        experiment, recipe_trial, horizons, methods, reach() if tuned else None
    )
    table = Table(title=f"{experiment.root.name}: forecast [interval]")
    table.add_column("row")
    for h in horizons:
        table.add_column(f"{h:g}x")
    for label, cells in predicted.rows.items():
        texts = [f"{cells[h].loss:.4f} [{cells[h].low:.4f}, {cells[h].high:.4f}]" for h in horizons]
        if "envelope" in label or label.startswith("constant"):  # at the LR the law picks
            texts = [f"{t} lr {cells[h].lr:.2g}" for t, h in zip(texts, horizons, strict=True)]
        table.add_row(label, *texts)
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    for basis, rows in predicted.bases().items():
        print(f"by the {basis}: {', '.join(rows)}; interval: {INTERVALS[basis]}")
    for label, cells in predicted.rows.items():
        for h, cell in cells.items():
            if cell.caution:
                print(f"caution: {label} at {h:g}x: {cell.caution}")
    # How well each law fits the curves it was fitted on: a forecast is no closer than that.
    for name, fit in predicted.laws.items():
        print(f"law {name}: fitted on {len(fit.curves)} trials, rmse {fit.law.rmse:.4f} nats")
    print(f"forecast: {write_forecast(predicted, experiment.root / 'forecast')}")
    return 0


def report(args: argparse.Namespace) -> int:
    from schedule_search.report.sweep import write_sweep_report
    from schedule_search.store.experiment import Experiment
    from schedule_search.sweep.optuna_study import write_optuna_mirror

    experiment = Experiment.named(args.name, args.storage)
    experiment.settings()
    space = _recorded_space(experiment)
    _warn_damaged(experiment)
    # The table and the Optuna journal first: a running or killed sweep has not written them
    # since its trials last moved.
    experiment.write_table()
    write_optuna_mirror(experiment, space)
    print(f"report: {write_sweep_report(experiment, space)}")
    return 0


def train(args: argparse.Namespace) -> int:
    from schedule_search.core.files import require_placeable
    from schedule_search.tasks.registry import build_task
    from schedule_search.train.config import check_workers, load_train_config
    from schedule_search.train.evaluation import Evaluation
    from schedule_search.train.launch import run_local

    config = load_train_config(args.config)
    check_workers(config.sharding, int(os.environ.get("WORLD_SIZE", args.workers)), args.config)
    build_task(config.task, config.seed, str(args.config))  # bad task options fail here, early
    run_dir = args.run_dir or Path("runs") / f"train-{args.config.stem}"
    require_placeable(run_dir, "--run-dir", folder=True)
    result = run_local(config, run_dir, args.workers, str(args.config))
    for point in map(Evaluation.from_metrics, result.history):
        print(f"{point.chinchilla:>6g}x  tokens {point.tokens:>12,}  val_loss {point.val_loss:.4f}")
    print(f"{result.status}; metrics and checkpoints in {run_dir}")
    return 0 if result.status == State.COMPLETED else 1
