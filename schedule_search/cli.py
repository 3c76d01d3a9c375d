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

from schedule_search import commands
from schedule_search.core.config import PLAIN_NAME, ConfigError, InputWarning, is_plain_name
from schedule_search.core.interrupts import Interrupted, terminate_as_interrupt

__all__ = ["build_parser", "main"]

EXIT_BAD_INPUT = 2
#: Top-level modules of the `sweep` extra (a core install has torch, numpy, pydantic, pyyaml).
SWEEP_EXTRA = {
    "ray",
    "optuna",
    "scipy",
    "greenlet",
    "schedulefree",
    "rich",
    "matplotlib",
    "pyarrow",
}


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
_non_negative_int = _number(int, lambda v: v >= 0, "an integer >= 0")
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


def _subset(text: str, allowed: Sequence[str]) -> list[str]:
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [m for m in chosen if m not in allowed]
    if not chosen or unknown:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated subset of {','.join(allowed)}, got {text!r}"
        )
    return chosen


def _methods(text: str) -> list[str]:
    from schedule_search.transfer.plan import METHODS

    return _subset(text, METHODS)


def _forecast_methods(text: str) -> list[str]:
    from schedule_search.forecast.predict import METHODS

    return _subset(text, METHODS)


def _name(text: str) -> str:
    if not is_plain_name(text):
        raise argparse.ArgumentTypeError(f"expected {PLAIN_NAME}, got {text!r}")
    return text


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
    _add_train(verbs)
    _add_sweep(verbs)
    _add_transfer(verbs)
    _add_forecast(verbs)
    for verb, handler, text in (
        ("resume", commands.resume, "continue a killed or stopped sweep"),
        ("status", commands.status, "a table of the sweep's trials (and its transfer's runs)"),
        ("export", commands.export, "write the best trial's config as a recipe"),
        ("report", commands.report, "a markdown report with plots and TensorBoard files"),
    ):
        sub = verbs.add_parser(verb, help=text)
        sub.add_argument("name", type=_name, help="experiment name (a folder under --storage)")
        _add_storage(sub)
        if verb == "export":
            _add_export_options(sub)
        sub.set_defaults(handler=handler)
    return parser


def _add_train(verbs) -> None:
    train = verbs.add_parser("train", help="one training run from a config (no search)")
    train.add_argument("config", type=Path, help="training config YAML (see README)")
    train.add_argument(
        "--workers", type=_positive_int, default=1, help="data-parallel processes (gloo)"
    )
    train.add_argument(
        "--run-dir", type=Path, default=None, help="default: runs/train-<config name>"
    )
    train.set_defaults(handler=commands.train)


def _add_sweep(verbs) -> None:
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
        "--workers",
        type=_positive_int,
        default=2,
        help="workers per trial (Ray Train; 1 CPU worker trains in the trial's process)",
    )
    sweep.add_argument(
        "--concurrency",
        type=_positive_int,
        default=None,
        help="trials at once (default: as many as this machine's CPUs and GPUs hold, or those of "
        "the cluster at --address)",
    )
    sweep.add_argument(
        "--horizon",
        type=_positive_float,
        default=None,
        help="objective horizon in Chinchilla multiples (default: the space's); also the end T "
        "of its cosine, linear and wsd schedules",
    )
    sweep.add_argument("--seed", type=int, default=None, help="TPE seed (default: the space's)")
    sweep.add_argument("--address", default=None, help="an existing Ray cluster (or RAY_ADDRESS)")
    sweep.add_argument(
        "--gpus-per-worker",
        type=_non_negative_float,
        default=0.0,
        help="GPUs per worker (NCCL, bf16 autocast); 0 = CPU and gloo",
    )
    sweep.add_argument(
        "--max-failures",
        type=_non_negative_int,
        default=2,
        help="restarts of a failed trial's workers, and then of the trial, before it counts "
        "as failed (a one-worker trial trained in its own process: of the trial only; 0: a "
        "failure is final)",
    )
    _add_storage(sweep)
    sweep.set_defaults(handler=commands.sweep)


def _add_horizons(parser: argparse.ArgumentParser, default_also: str) -> None:
    parser.add_argument(
        "--to",
        type=_multiples,
        default=None,
        help="horizons in Chinchilla multiples beyond the sweep's "
        f"(default: 8,16,32{default_also})",
    )


def _add_forecast(verbs) -> None:
    forecast = verbs.add_parser(
        "forecast", help="predict the recipe's and the envelopes' loss at longer horizons"
    )
    forecast.add_argument("name", type=_name, help="the sweep whose curves to fit")
    _add_horizons(forecast, "")
    forecast.add_argument(
        "--methods",
        type=_forecast_methods,
        default=None,
        help="a comma-separated subset of recipe,constant,cosine,linear (default: all; "
        "`recipe` alone needs no law where its trial evaluated 4 times past its warmup)",
    )
    _add_storage(forecast)
    forecast.set_defaults(handler=commands.forecast)


def _add_transfer(verbs) -> None:
    transfer = verbs.add_parser("transfer", help="the recipe at longer horizons vs references")
    transfer.add_argument("name", type=_name, help="the sweep whose recipe to transfer")
    _add_horizons(transfer, ", or those of the transfer being resumed")
    transfer.add_argument(
        "--methods",
        type=_methods,
        default=None,
        help="a comma-separated subset of recipe,constant,schedulefree,cosine,linear,wsd",
    )
    transfer.add_argument(
        "--seeds",
        type=_positive_int,
        default=None,
        help="seeds per row (default 1, or the resumed transfer's): every row but the LR "
        "grids trained again with seeds 1..K-1, each cell a mean with a 95%% interval",
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
    transfer.add_argument(
        "--reuse",
        type=Path,
        default=None,
        metavar="FOLDER",
        help="an earlier transfer's folder (moved aside): every run this one plans under the "
        "same name and config that ended there is copied, not trained again",
    )
    _add_storage(transfer)
    transfer.set_defaults(handler=commands.transfer)


def _add_export_options(export: argparse.ArgumentParser) -> None:
    export.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        help="recipe file (default: runs/<name>/recipe.yaml)",
    )
    export.add_argument(
        "--max-slowdown",
        type=_at_least_one,
        default=None,
        help="pick the lowest loss among trials at most this many times slower "
        "(wall clock to the horizon) than the fastest",
    )
    export.add_argument(
        "--at",
        type=_positive_float,
        default=None,
        metavar="H",
        help="pick the trial whose own curve (its evaluations past its warmup, continued) "
        "forecasts the lowest loss at H Chinchilla multiples, at or beyond the sweep's "
        "horizon; the forecast is written into the recipe",
    )
    export.add_argument(
        "--within",
        type=_non_negative_float,
        default=None,
        metavar="NATS",
        help="with --at: only among trials at most NATS above the best loss at the sweep's "
        "horizon (of any trial), those it cannot tell apart: say, one config's spread over "
        "seeds (BENCHMARKS.md, 'What one seed can rank')",
    )


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
        with terminate_as_interrupt():
            return args.handler(args)
    except ConfigError as err:
        # One line, whatever the input held (a newline in a flag or a YAML key included).
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(err))
        print(f"error: {text}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ModuleNotFoundError as err:
        if (err.name or "").split(".")[0] not in SWEEP_EXTRA:
            raise
        print(
            f"error: {err.name} is not installed; the command line needs the sweep extra: "
            "pip install 'schedule-search[sweep]'",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # before Tune ran, or a second Ctrl-C: stopped where it was
        print("interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except Interrupted as stop:  # SIGTERM where nothing runs that could be checkpointed
        print(f"stopped by {stop}", file=sys.stderr)
        return stop.exit_code


if __name__ == "__main__":
    sys.exit(main())
