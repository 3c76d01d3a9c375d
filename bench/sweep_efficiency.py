"""Sweep efficiency: the share of wall time spent in training steps.

Two figures, each `train_s` (the trainer's own clock, windows only: evaluation, checkpoints and
reports excluded) over a wall time:
- a sweep of one 2-minute trial (the default space, `--samples 1`), run here: its training
  seconds over the driver's time for the trial, and over the whole command (Ray start-up and
  shutdown included);
- the default `make sweep`, read from its experiment folder when one exists (`runs/default`):
  all trials' training seconds over the driver's wall time from `driver.jsonl`.

Concurrency on this machine: `--concurrency` defaults to CPUs // workers; on 2 cores with 2
single-thread workers a trial, one trial runs at a time (a second would put 4 busy processes
on 2 cores, and each would run at half speed: no gain, and twice the memory).

Run: `python bench/sweep_efficiency.py [--experiment runs/default]`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from one_trial import sweep_one_trial

from schedule_search.store.experiment import Experiment

ROOT = Path(__file__).resolve().parents[1]


def training_seconds(experiment: Experiment) -> dict[str, tuple[float, float]]:
    """trial id -> (train_s at its last evaluation, the driver's seconds for the trial)."""
    out = {}
    for trial_id in experiment.trial_ids():
        history = experiment.read_trial_json(trial_id, "metrics.json") or []
        result = experiment.read_trial_json(trial_id, "result.json") or {}
        if history and "trial_s" in result:
            out[trial_id] = (history[-1].get("train_s", 0.0), result["trial_s"])
    return out


def driver_wall(experiment: Experiment) -> float | None:
    """Seconds from the first launch's start to the last end in driver.jsonl (resumes summed)."""
    path = experiment.root / "driver.jsonl"
    if not path.is_file():
        return None
    total, started = 0.0, None
    for event in (json.loads(line) for line in path.read_text().splitlines() if line.strip()):
        if event["event"] == "started":
            started = event["time"]
        elif event["event"] == "ended" and started is not None:
            total, started = total + event["time"] - started, None
    return total or None


def two_minute_trial() -> None:
    with tempfile.TemporaryDirectory() as storage:
        start = time.monotonic()
        experiment = sweep_one_trial(
            storage,
            "efficiency",
            stdout=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        command_s = time.monotonic() - start
        ((train_s, trial_s),) = training_seconds(experiment).values()
        print(
            f"| one 2-minute default trial (2 workers) | {train_s:.1f} s | trial: {trial_s:.1f} s "
            f"-> **{train_s / trial_s:.3f}**; whole command: {command_s:.1f} s -> "
            f"{train_s / command_s:.3f} |"
        )


def default_sweep(path: Path) -> None:
    experiment = Experiment(path)
    trials = training_seconds(experiment)
    wall = driver_wall(experiment)
    if not trials or wall is None:
        print(
            f"| the default `make sweep` | not measured: no finished sweep with driver.jsonl at "
            f"{path} (run `make sweep`) | |"
        )
        return
    train_s = sum(t for t, _ in trials.values())
    trial_s = sum(s for _, s in trials.values())
    print(
        f"| the default `make sweep` ({len(trials)} trials, {path}) | {train_s:.1f} s | "
        f"trials: {trial_s:.1f} s -> {train_s / trial_s:.3f}; driver: {wall:.1f} s -> "
        f"**{train_s / wall:.3f}** |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", type=Path, default=ROOT / "runs" / "default")
    args = parser.parse_args()
    print("| sweep | training seconds | share of wall time |")
    print("| --- | --- | --- |")
    two_minute_trial()
    default_sweep(args.experiment)
    print(
        f"concurrent trials here: {os.cpu_count()} CPUs // 2 workers = "
        f"{max(1, (os.cpu_count() or 1) // 2)}"
    )


if __name__ == "__main__":
    main()
