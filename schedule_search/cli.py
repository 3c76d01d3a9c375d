"""`schedule-search`: the command line. Every bad input is one line on stderr and exit code 2,
before anything is launched."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from schedule_search.config import ConfigError

EXIT_BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (no usage block) and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"{self.prog}: {message}")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


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
    return parser


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


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.handler(args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
