"""Ctrl-C and SIGTERM stop a sweep or a transfer the way Tune stops on Ctrl-C: its trials are
checkpointed where they are and its state saved, so `resume` (or `transfer` again) continues.

Tune handles SIGINT itself and then returns from `fit()` as if the run had ended, and a
SIGTERM kills the driver with a native stack dump. While Tune runs, both signals are recorded
here and forwarded to Tune's graceful stop (its SIGUSR1 handler); after `fit()` the caller
raises `Interrupted`, which the CLI turns into one line and exit code 128 + the signal.
A second signal stops at once. Outside Tune, the CLI turns SIGTERM into `Interrupted` too
(`terminate_as_interrupt`), so a scheduler's SIGTERM at any moment is one line and exit 143.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Interrupted", "StopSignal", "graceful_stop", "quiet", "terminate_as_interrupt"]


class Interrupted(Exception):
    """The run was stopped by a signal; its state is saved."""

    def __init__(self, number: int) -> None:
        super().__init__(signal.Signals(number).name)
        self.number = number

    @property
    def exit_code(self) -> int:
        return 128 + self.number


@dataclass
class StopSignal:
    number: int | None = None


@contextlib.contextmanager
def graceful_stop() -> Iterator[StopSignal]:
    """Within: SIGINT and SIGTERM ask Tune to stop gracefully and are recorded."""
    received = StopSignal()

    def on_signal(number: int, frame: Any) -> None:
        if received.number is not None:
            raise KeyboardInterrupt  # a second signal: the user means now
        received.number = number
        if callable(signal.getsignal(signal.SIGUSR1)):  # Tune's, installed once fit() started
            os.kill(os.getpid(), signal.SIGUSR1)  # Tune's own graceful-stop signal
        else:
            raise Interrupted(number)  # before Tune runs there is nothing to save

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, signal.SIG_DFL)  # no stale Tune's
    tune_handler = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"  # SIGINT is ours; Tune keeps SIGUSR1
    try:
        yield received
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if tune_handler is None:
            os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
        else:
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = tune_handler


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within: SIGTERM raises `Interrupted`, as Ctrl-C raises KeyboardInterrupt."""

    def on_terminate(number: int, frame: Any) -> None:
        raise Interrupted(number)

    previous = signal.signal(signal.SIGTERM, on_terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def quiet(logger_name: str) -> Iterator[None]:
    """Within: the logger says nothing. Tune's notices name `Tuner.restore(...)` where the CLI
    names the command that resumes, and print each failed trial's traceback where the live
    view prints its one-line cause (the traceback stays in the file its record names)."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)
