"""`schedule-search`: the command line. Every bad input is one line on stderr and exit code 2,
before anything is launched."""

from __future__ import annotations

import argparse
import math
import signal
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from schedule_search.config import PLAIN_NAME, ConfigError, InputWarning, is_plain_name
from schedule_search.lock import experiment_lock

EXIT_BAD_INPUT = 2
EXIT_UNFINISHED = 1
DEFAULT_TRANSFER_MULTIPLES = [8.0, 16.0, 32.0]


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (no usage block) and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"{self.prog}: {message}")


def _number(convert: Callable[[str], float], accept: Callable[[float], bool], expected: str):
    """An argparse type: `convert` the text, and refuse it unless `accept`s the value."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not accept(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


_positive_int = _number(int, lambda v: v > 0, "a positive integer")
_positive_float = _number(float, lambda v: 0 < v < math.inf, "a positive number")
_non_negative_float = _number(float, lambda v: 0 <= v < math.inf, "a number >= 0")
_at_least_one = _number(float, lambda v: 1 <= v < math.inf, "a number >= 1")


def _multiples(text: str) -> list[float]:
    try:
        values = sorted({float(part) for part in text.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated Chinchilla multiples like 8,16,32, got {text!r}"
        ) from None
    if not values or not all(0 < v < float("inf") for v in values):
        raise argparse.ArgumentTypeError(f"expected positive multiples, got {text!r}")
    return values


def _methods(text: str) -> list[str]:
    from schedule_search.transfer import METHODS

    chosen = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [m for m in chosen if m not in METHODS]
    if not chosen or unknown:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated subset of {','.join(METHODS)}, got {text!r}"
        )
    return chosen


def _name(text: str) -> str:
    if not is_plain_name(text):
        raise argparse.ArgumentTypeError(f"expected {PLAIN_NAME}, got {text!r}")
    return text


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


def _add_storage(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--storage", type=Path, default=None, help="experiments folder (default: runs/)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="schedule-search",
        description="Search horizon-free LR schedules, EMA and time windows (Ray Tune + Optuna).",
    )
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)

    train = verbs.add_parser("train", help="one training run from a config (no search)")
    train.add_argument("config", type=Path, help="training config YAML (see README)")
    train.add_argument(
        "--workers", type=_positive_int, default=1, help="data-parallel processes (gloo)"
    )
    train.add_argument(
        "--run-dir", type=Path, default=None, help="default: runs/train-<config name>"
    )
    train.set_defaults(handler=_train)

    sweep = verbs.add_parser(
        "sweep", help="search a space with Ray Tune + Optuna over Ray Train trials"
    )
    sweep.add_argument("space", type=Path, help="search space YAML (see search_spaces/)")
    sweep.add_argument(
        "--name", type=_name, default=None, help="experiment name (default: the space's)"
    )
    sweep.add_argument(
        "--samples", type=_positive_int, default=None, help="trials (default: the space's)"
    )
    sweep.add_argument(
        "--workers", type=_positive_int, default=2, help="Ray Train workers per trial"
    )
    sweep.add_argument(
        "--concurrency",
        type=_positive_int,
        default=None,
        help="trials at once (default: CPUs // (workers x CPUs per worker))",
    )
    sweep.add_argument(
        "--horizon",
        type=_positive_float,
        default=None,
        help="objective horizon in Chinchilla multiples (default: the space's)",
    )
    sweep.add_argument("--seed", type=int, default=None, help="TPE seed (default: the space's)")
    sweep.add_argument("--address", default=None, help="an existing Ray cluster (or RAY_ADDRESS)")
    sweep.add_argument(
        "--gpus-per-worker",
        type=_non_negative_float,
        default=0.0,
        help="GPUs per worker (NCCL, bf16 autocast); 0 = CPU and gloo",
    )
    _add_storage(sweep)
    sweep.set_defaults(handler=_sweep)

    transfer = verbs.add_parser("transfer", help="the recipe at longer horizons vs references")
    transfer.add_argument("name", type=_name, help="the sweep whose recipe to transfer")
    transfer.add_argument(
        "--to",
        type=_multiples,
        default=None,
        help="horizons in Chinchilla multiples beyond the sweep's (default: 8,16,32, or "
        "those of the transfer being resumed)",
    )
    transfer.add_argument(
        "--methods",
        type=_methods,
        default=None,
        help="a comma-separated subset of recipe,constant,schedulefree,cosine,linear,wsd",
    )
    transfer.add_argument(
        "--workers",
        type=_positive_int,
        default=None,
        help="Ray Train workers per run (default: the sweep's, or the resumed transfer's); "
        "micro-batches per window are rescaled to keep the recipe's tokens per step",
    )
    transfer.add_argument(
        "--concurrency",
        type=_positive_int,
        default=None,
        help="runs at once (default: the sweep's, or the resumed transfer's)",
    )
    _add_storage(transfer)
    transfer.set_defaults(handler=_transfer)

    for verb, handler, text in (
        ("resume", _resume, "continue a killed or stopped sweep"),
        ("status", _status, "a table of the sweep's trials"),
        ("export", _export, "write the best trial's config as a recipe"),
        ("report", _report, "a markdown report with plots and TensorBoard files of the sweep"),
    ):
        sub = verbs.add_parser(verb, help=text)
        sub.add_argument("name", type=_name, help="experiment name (a folder under --storage)")
        _add_storage(sub)
        if verb == "export":
            sub.add_argument(
                "-o",
                "--output",
                type=Path,
                default=None,
                help="recipe file (default: runs/<name>/recipe.yaml)",
            )
            sub.add_argument(
                "--max-slowdown",
                type=_at_least_one,
                default=None,
                help="pick the lowest loss among trials at most this many times slower "
                "(wall clock to the horizon) than the fastest",
            )
        sub.set_defaults(handler=handler)
    return parser


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


def _sweep(args: argparse.Namespace) -> int:
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


def _resume(args: argparse.Namespace) -> int:
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


def _transfer(args: argparse.Namespace) -> int:
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


def _status(args: argparse.Namespace) -> int:
    from schedule_search.experiment import Experiment

    experiment = Experiment.named(args.name, args.storage)
    experiment.settings()  # a clear error when there is no such sweep
    _print_table(experiment)
    return 0


def _export(args: argparse.Namespace) -> int:
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


def _report(args: argparse.Namespace) -> int:
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


def _train(args: argparse.Namespace) -> int:
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


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Our input warnings as one line each; everything else as Python shows it."""
    if issubclass(category, InputWarning):
        print(f"warning: {message}", file=file or sys.stderr)
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


_python_show_warning = warnings.showwarning


def main(argv: Sequence[str] | None = None) -> int:
    warnings.showwarning = _show_warning
    try:
        args = build_parser().parse_args(argv)
        return args.handler(args)
    except ConfigError as err:
        # One line, whatever the input held (a newline in a flag or a YAML key included).
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(err))
        print(f"error: {text}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # before Tune ran, or a second Ctrl-C: stopped where it was
        print("interrupted", file=sys.stderr)
        return 128 + signal.SIGINT


if __name__ == "__main__":
    sys.exit(main())
