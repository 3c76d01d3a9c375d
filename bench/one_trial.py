"""A one-trial sweep of the default space through the CLI, as a user runs it: shared by the
benchmarks that measure a whole trial (sweep efficiency, the GPU path)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from schedule_search.store.experiment import Experiment

DEFAULT_SPACE = Path(__file__).resolve().parents[1] / "search_spaces" / "default.yaml"


def sweep_one_trial(
    storage: str, name: str, *flags: str, space: Path = DEFAULT_SPACE, **run: Any
) -> Experiment:
    """Runs `schedule-search sweep` of `space` (the default space) with `--samples 1` and
    `flags`; `run` goes to `subprocess.run`. Returns the experiment it wrote."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "schedule_search.cli",
            "sweep",
            str(space),
            "--samples",
            "1",
            "--name",
            name,
            "--storage",
            storage,
            *flags,
        ],
        check=True,
        **run,
    )
    return Experiment(Path(storage) / name)
