"""The paper's theory check on power-law linear regression, transfer-style.

For a = 1.5 and b = a, b = 2a: SGD with constant LR + EMA versus the shifted 1/sqrt schedule
(alpha offset) + EMA, the same peak LR, over a long horizon. Prints the excess risk at every
multiple, the fitted tail slope d log(risk) / d log(tokens), and the theory's best decay
exponent gamma* = max(0, 1 - a/b): gamma* = 0 says a constant LR (with averaging) is best,
gamma* = 0.5 says 1/sqrt decay is. The EMA's half-life is a fraction of the run's age (a
uniform average from step 1 does not show the effect).

Then the search itself (`--sweeps`): the shipped linreg space (gamma, alpha and LR searched,
the EMA fraction through the bank) swept for real at b = 2a and b = a, the gamma it picks at
its 4x horizon printed next to gamma*.

Run: `python bench/linreg_theory.py [--horizon 64] [--sweeps]` (about a minute on two cores;
the sweeps add a few minutes: Ray starts each trial's workers).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

from schedule_search.core.config import load_yaml, parse
from schedule_search.store.experiment import Experiment
from schedule_search.train.config import TrainConfig
from schedule_search.train.launch import run_local

A = 1.5


def run(b: float, kind: str, horizon: float, lr: float, frac: float) -> list[dict]:
    multiples, m = [], 0.25
    while m < horizon:
        multiples.append(m)
        m *= 2
    config = parse(
        TrainConfig,
        {
            "task": {"name": "linreg", "dim": 128, "a": A, "b": b, "noise": 0.1, "batch": 16},
            "optimizer": {"name": "sgd", "lr": lr},
            "schedule": {"kind": kind, "gamma": 0.5, "warmup": 0.0},  # alpha: the paper's 4x
            "ema": {"fractions": [0.0, frac], "objective": frac},
            "window": {"microbatches": 1, "clip_norm": None},
            "budget": {"horizon": horizon, "eval_at": multiples},
        },
        "linreg theory",
    )
    with tempfile.TemporaryDirectory() as folder:
        return run_local(config, folder).history


def sweep_gamma(b: float, samples: int | None) -> tuple[dict, float, float]:
    """(best trial's params, its EMA fraction, its loss) of the shipped linreg space swept with
    the task's b set, through the CLI as a user runs it."""
    space = load_yaml(Path(__file__).resolve().parents[1] / "search_spaces" / "linreg.yaml")
    space["base"]["task"]["b"] = b
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "linreg.yaml"
        path.write_text(yaml.safe_dump(space))
        flags = ["--samples", str(samples)] if samples else []
        command = [sys.executable, "-m", "schedule_search.cli", "sweep", str(path)]
        subprocess.run(
            [*command, "--name", "lin", "--storage", folder, *flags],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        best = Experiment(Path(folder) / "lin").best(space["base"]["budget"]["horizon"])
        assert best is not None, "no trial reached the horizon"
        return best.params, best.ema_fraction, best.val_loss


def tail_slope(history: list[dict], start: float) -> float:
    tail = [r for r in history if r["chinchilla"] >= start]
    x = np.log([r["tokens"] for r in tail])
    y = np.log([r["val_loss"] for r in tail])
    return float(np.polyfit(x, y, 1)[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--horizon", type=float, default=64.0)
    parser.add_argument("--lr", type=float, default=0.3)
    parser.add_argument("--frac", type=float, default=0.1, help="EMA half-life / age")
    parser.add_argument("--sweeps", action="store_true", help="also sweep the linreg space")
    parser.add_argument("--samples", type=int, default=None, help="trials per sweep")
    args = parser.parse_args()
    print(
        f"linreg a = {A}, d = 128, SGD lr {args.lr}, EMA fraction {args.frac}, "
        f"horizon {args.horizon:g}x Chinchilla; slopes fitted from {args.horizon / 8:g}x on"
    )
    print("| b | gamma* = max(0, 1 - a/b) | method | risk at 1x | risk at end | tail slope |")
    print("| --- | --- | --- | --- | --- | --- |")
    for b in (A, 2 * A):
        gamma_star = max(0.0, 1 - A / b)
        finals = {}
        for kind, label in (("constant", "constant + EMA"), ("poly", "1/sqrt + EMA")):
            history = run(b, kind, args.horizon, args.lr, args.frac)
            at_1x = next(r["val_loss"] for r in history if math.isclose(r["chinchilla"], 1.0))
            finals[label] = history[-1]["val_loss"]
            print(
                f"| {b:g} | {gamma_star:g} | {label} | {at_1x:.3e} | {history[-1]['val_loss']:.3e} "
                f"| {tail_slope(history, args.horizon / 8):+.3f} |"
            )
        winner = min(finals, key=finals.get)
        favoured = "constant + EMA" if gamma_star < 0.25 else "1/sqrt + EMA"
        print(f"|  |  | theory favours {favoured}; measured best at the end: {winner} |  |  |  |")
    if not args.sweeps:
        return
    print("\n| b | gamma* | the sweep's gamma (4x) | its alpha | its LR | EMA fraction | loss |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for b in (2 * A, A):
        params, frac, loss = sweep_gamma(b, args.samples)
        print(
            f"| {b:g} | {max(0.0, 1 - A / b):g} | {params['schedule.gamma']:.3f} | "
            f"{params['schedule.alpha']:.3g} | {params['optimizer.lr']:.3g} | {frac:g} | "
            f"{loss:.3e} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
