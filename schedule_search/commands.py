"""What each verb of the CLI does (`cli` parses the command line and dispatches here): every
handler takes the parsed arguments and returns the exit code; bad input is a ConfigError."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from schedule_search.config import ConfigError, InputWarning
from schedule_search.lock import experiment_lock

EXIT_UNFINISHED = 1
DEFAULT_TRANSFER_MULTIPLES = [8.0, 16.0, 32.0]


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


def _prepare_space(args: argparse.Namespace) -> tuple[dict, str]:
    """The space with the command line's overrides applied, validated; nothing written yet."""
    import tempfile

    import yaml

    from schedule_search.config import load_yaml
    from schedule_search.space import load_space

    data = load_yaml(args.space)
    if not isinstance(data, dict):
        raise ConfigError(f"{args.space}: expected a mapping of keys, got {type(data).__name__}")
    if args.samples is not None:
        data["samples"] = args.samples
    if args.seed is not None:
        data["seed"] = args.seed
    if args.horizon is not None:
        budget = data.setdefault("base", {}).setdefault("budget", {})
        if isinstance(budget, dict):
            budget["horizon"] = args.horizon
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / args.space.name
        copy.write_text(yaml.safe_dump(data, sort_keys=False))
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always", InputWarning)
                space = load_space(copy)
        except ConfigError as err:
            raise ConfigError(str(err).replace(str(copy), str(args.space))) from None
    for warning in seen:  # shown with the user's file, not the scratch copy
        text = str(warning.message).replace(str(copy), str(args.space))
        warnings.warn_explicit(text, warning.category, warning.filename, warning.lineno)
    return data, space.name


def sweep(args: argparse.Namespace) -> int:
    import yaml

    from schedule_search.checkpoint import atomic_write_text
    from schedule_search.experiment import Experiment
    from schedule_search.resources import check_resources

    data, space_name = _prepare_space(args)
    name = args.name or space_name
    experiment = Experiment.named(name, args.storage)
    if (experiment.root / "sweep.json").exists():
        raise ConfigError(
            f"{experiment.root}: experiment exists; `{_again('resume', name, args.storage)}` "
            "continues it"
        )
    settings = _settings(args, data, name)
    check_resources(settings)  # before anything is written: a trial that cannot fit waits forever
    with experiment_lock(experiment.root, "sweep"):
        if (experiment.root / "sweep.json").exists():  # another sweep got here first
            raise ConfigError(f"{experiment.root}: experiment exists")
        atomic_write_text(experiment.root / "space.yaml", yaml.safe_dump(data, sort_keys=False))
        experiment.save_settings(settings)
        return _run(settings, experiment, args.storage, resume=False)


def _settings(args: argparse.Namespace, data: dict, name: str):
    """How the sweep launches (saved in sweep.json so `resume` launches it the same way)."""
    import os

    from schedule_search.experiment import SweepSettings

    cpus = os.cpu_count() or 1
    return SweepSettings(
        name=name,
        samples=int(data.get("samples", 8)),
        workers=args.workers,
        concurrency=args.concurrency or max(1, int(cpus // args.workers)),
        seed=int(data.get("seed", 0)),
        gpus_per_worker=args.gpus_per_worker,
        address=args.address or os.environ.get("RAY_ADDRESS"),
        max_failures=args.max_failures,
    )


def _run(settings, experiment, storage: Path | None, resume: bool) -> int:
    from schedule_search.failures import TrialsFailed
    from schedule_search.interrupts import Interrupted
    from schedule_search.search import sweep

    try:
        sweep(settings, experiment, resume=resume)
    except TrialsFailed as err:
        print(f"sweep ended: {err}", file=sys.stderr)
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


def resume(args: argparse.Namespace) -> int:
    from schedule_search.experiment import Experiment
    from schedule_search.resources import check_resources

    experiment = Experiment.named(args.name, args.storage)
    settings = experiment.settings()
    check_resources(settings)
    with experiment_lock(experiment.root, "resume"):
        return _run(settings, experiment, args.storage, resume=True)


def _recorded_space(experiment):
    """The experiment's own copy of its space, read without building its task."""
    from schedule_search.space import load_space

    return load_space(experiment.root / "space.yaml", check_task=False)


def _horizon(experiment) -> float:
    from schedule_search.space import trial_config

    return trial_config(_recorded_space(experiment), {}).budget.horizon


def _warn_damaged(experiment) -> None:
    for problem in experiment.problems():
        print(f"warning: {problem}; that trial is left out", file=sys.stderr)


def _print_table(experiment) -> None:
    from rich.console import Console
    from rich.table import Table

    from schedule_search.averaging import fraction_label

    horizon = _horizon(experiment)
    _warn_damaged(experiment)
    rows = experiment.write_table(horizon)
    best = experiment.best(horizon)
    table = Table(title=f"{experiment.root.name}: {len(rows)} trials (objective at {horizon:g}x)")
    params = sorted({k for r in rows for k in r.params})
    for column in ["trial", "state", "reached", "val_loss", "ema fraction", "best", *params]:
        table.add_column(column)
    for r in sorted(rows, key=lambda r: (r.state != "completed", r.val_loss)):
        mark = " *" if best is not None and r.trial_id == best.trial_id else ""
        table.add_row(
            r.trial_id + mark,
            r.state,
            f"{r.chinchilla:g}x",
            f"{r.val_loss:.4f}",
            fraction_label(r.ema_fraction),
            f"{r.best_val_loss:.4f}",
            *[
                f"{r.params.get(p, ''):.4g}"
                if isinstance(r.params.get(p), float)
                else str(r.params.get(p, ""))
                for p in params
            ],
        )
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    print(f"table: {experiment.root / 'trials.csv'}")


def transfer(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from schedule_search.experiment import Experiment
    from schedule_search.failures import TrialsFailed
    from schedule_search.interrupts import Interrupted
    from schedule_search.resources import check_resources
    from schedule_search.transfer import (
        METHODS,
        Unfinished,
        build_study,
        run_transfer,
        transfer_base,
    )

    sweep = Experiment.named(args.name, args.storage)
    settings = sweep.settings()
    # A resumed transfer runs as it was launched, unless a flag says otherwise.
    launched = sweep.root / "transfer" / "plan.json"
    before = json.loads(launched.read_text()) if launched.exists() else {}
    workers = args.workers or before.get("workers")
    concurrency = args.concurrency or before.get("concurrency")
    if workers:
        settings = dataclasses.replace(settings, workers=workers)
    if concurrency:
        settings = dataclasses.replace(settings, concurrency=concurrency)
    base, _ = transfer_base(sweep, settings.workers)
    targets = args.to or before.get("to") or DEFAULT_TRANSFER_MULTIPLES
    horizons = sorted({base.budget.horizon, *targets})
    methods = args.methods or before.get("methods") or list(METHODS)
    build_study(sweep, settings, horizons, methods)  # every first run is valid before Ray starts
    check_resources(settings)
    launched_as = (before.get("horizons"), set(before.get("methods", [])), before.get("workers"))
    if before and launched_as != (horizons, set(methods), settings.workers):
        raise ConfigError(
            f"{launched.parent}: a transfer to {','.join(f'{h:g}' for h in before['horizons'])}x "
            f"with {','.join(before['methods'])} on {before['workers']} workers is there; this "
            "one would change its runs. Move that folder aside to run another"
        )
    with experiment_lock(sweep.root, "transfer"):
        resume = launched.exists()
        try:
            root = run_transfer(sweep, settings, horizons, methods, resume)
        except TrialsFailed as err:
            print(f"transfer ended: {err}", file=sys.stderr)
            return EXIT_UNFINISHED
        except Interrupted as stop:
            again = _again("transfer", args.name, args.storage)
            print(f"transfer stopped by {stop}; `{again}` resumes it", file=sys.stderr)
            return stop.exit_code
        except Unfinished as err:
            again = _again("transfer", args.name, args.storage)
            print(f"transfer stopped: {err}; `{again}` resumes it", file=sys.stderr)
            return EXIT_UNFINISHED
    print((root / "transfer.md").read_text())
    print(f"table, JSON and plots in {root}")
    return 0


def status(args: argparse.Namespace) -> int:
    from schedule_search.experiment import Experiment

    experiment = Experiment.named(args.name, args.storage)
    experiment.settings()  # a clear error when there is no such sweep
    _print_table(experiment)
    return 0


def export(args: argparse.Namespace) -> int:
    from schedule_search.averaging import fraction_label
    from schedule_search.experiment import Experiment

    experiment = Experiment.named(args.name, args.storage)
    experiment.settings()
    output = args.output or experiment.root / "recipe.yaml"
    best, _ = experiment.export(output, _horizon(experiment), args.max_slowdown)
    print(
        f"trial {best.trial_id}: val_loss {best.val_loss:.4f} at {best.chinchilla:g}x "
        f"(EMA fraction {fraction_label(best.ema_fraction)}) -> {output}"
    )
    return 0


def report(args: argparse.Namespace) -> int:
    from schedule_search.experiment import Experiment
    from schedule_search.optuna_study import write_optuna_mirror
    from schedule_search.sweep_report import write_sweep_report

    experiment = Experiment.named(args.name, args.storage)
    experiment.settings()
    space = _recorded_space(experiment)
    _warn_damaged(experiment)
    # The table and the Optuna journal first: a running or killed sweep has not written them
    # since its trials last moved.
    experiment.write_table(_horizon(experiment))
    write_optuna_mirror(experiment, space)
    print(f"report: {write_sweep_report(experiment, space)}")
    return 0


def train(args: argparse.Namespace) -> int:
    from schedule_search.launch import run_local
    from schedule_search.tasks import build_task
    from schedule_search.train import load_train_config

    config = load_train_config(args.config)
    build_task(config.task, config.seed, str(args.config))  # bad task options fail here, early
    run_dir = args.run_dir or Path("runs") / f"train-{args.config.stem}"
    result = run_local(config, run_dir, args.workers, str(args.config))
    for row in result.history:
        print(
            f"{row['chinchilla']:>6g}x  tokens {row['tokens']:>12,}  val_loss {row['val_loss']:.4f}"
        )
    print(f"{result.status}; metrics and checkpoints in {run_dir}")
    return 0 if result.status == "completed" else 1
