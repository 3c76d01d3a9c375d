"""Transfer: the plan, the envelope, and a real (small) transfer on linreg through Ray."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from schedule_search import checkpoint as ckpt
from schedule_search.config import parse, to_dict
from schedule_search.experiment import Experiment
from schedule_search.recipe import load_recipe
from schedule_search.report import transfer_table
from schedule_search.schedules import Warmup, Wsd
from schedule_search.train import TrainConfig
from schedule_search.transfer import TransferPlan, plan, run_names

BASE = parse(
    TrainConfig,
    {
        "task": {"name": "linreg", "dim": 64, "batch": 16},
        "optimizer": {"name": "sgd", "lr": 0.1},
        "schedule": {"kind": "poly", "gamma": 0.3, "alpha": 0.05, "warmup": 0.05},
        "ema": {"fractions": [0.0, 0.04], "objective": 0.04},
        "window": {"microbatches": 2},
        "budget": {"horizon": 1.0, "eval_at": [0.5]},
    },
    "test",
)


def test_plan_has_the_grid_the_branch_points_and_one_anytime_run():
    p = plan(BASE, [1.0, 2.0, 4.0], ["recipe", "constant", "poly", "cosine", "wsd"])
    cosines = {n: c for n, c in p.runs.items() if n.startswith("cosine")}
    assert len(cosines) == 9
    for h in (1.0, 2.0, 4.0):
        lrs = sorted(
            c["optimizer"]["lr"] for n, c in cosines.items() if n.startswith(f"cosine-{h:g}x")
        )
        assert lrs == pytest.approx([0.05, 0.1, 0.2])
        assert all(c["schedule"]["horizon"] == c["budget"]["horizon"] for c in cosines.values())
    recipe = p.runs["recipe"]
    assert recipe["budget"]["horizon"] == 4.0 and {1.0, 2.0} <= set(recipe["budget"]["eval_at"])
    assert recipe["schedule"] == p.runs["recipe"]["schedule"] and recipe["schedule"]["gamma"] == 0.3
    constant = p.runs["constant"]
    assert constant["schedule"]["kind"] == "constant"
    assert {0.9, 1.8, 3.6} <= set(constant["budget"]["eval_at"])
    assert constant["checkpoint"]["keep"] >= len(constant["budget"]["eval_at"]) + 1
    assert p.runs["poly"]["schedule"]["gamma"] == 0.5
    assert p.branches == {"wsd-1x": 1.0, "wsd-2x": 2.0, "wsd-4x": 4.0}


def test_a_recipe_that_is_1_over_sqrt_is_not_run_twice():
    tree = to_dict(BASE)
    tree["schedule"]["gamma"] = 0.5
    p = plan(parse(TrainConfig, tree, "test"), [1.0, 2.0], ["recipe", "poly"])
    assert set(p.runs) == {"recipe"} and p.same_as == {"poly": "recipe"}


def history(*points):
    return [{"chinchilla": h, "tokens": int(h * 100), "val_loss": v} for h, v in points]


def test_envelope_is_the_best_cosine_per_horizon():
    p = TransferPlan([1.0, 2.0], {}, {})
    runs = {
        "cosine-1x-lr0.5": history((1.0, 3.0)),
        "cosine-1x-lr1": history((1.0, 2.5)),
        "cosine-1x-lr2": history((1.0, math.nan)),  # a diverged run does not count
        "cosine-2x-lr0.5": history((1.0, 2.9), (2.0, 2.2)),
        "cosine-2x-lr1": history((1.0, 2.7), (2.0, 2.4)),
        "recipe": history((1.0, 2.6), (2.0, 2.25)),
    }
    table = transfer_table(p, runs)
    assert table["loss"]["cosine envelope"] == {"1": 2.5, "2": 2.2}
    assert table["envelope_runs"] == {"1": "cosine-1x-lr1", "2": "cosine-2x-lr0.5"}
    assert table["gap_to_envelope"]["recipe (anytime + EMA)"]["1"] == pytest.approx(0.1)
    # The cosine tuned for the largest horizon, seen at the smaller one:
    assert table["loss"]["cosine tuned for 2x"]["1"] == 2.9


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_small_transfer_on_linreg(tmp_path):
    space = {
        "name": "lt",
        "samples": 1,
        "base": {
            "task": {"name": "linreg", "dim": 64, "batch": 16},
            "optimizer": {"name": "sgd", "lr": 0.1},
            "schedule": {"kind": "poly", "alpha": 0.05, "warmup": 0.05, "gamma": 0.5},
            "ema": {"fractions": [0.0, 0.04], "objective": 0.04},
            "window": {"policy": "microbatches", "microbatches": 2},
            "budget": {"horizon": 1.0, "eval_at": [0.5]},
        },
        "params": {"optimizer.lr": {"type": "loguniform", "low": 0.05, "high": 0.2}},
    }
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    storage = str(tmp_path / "runs")
    cli = [sys.executable, "-m", "schedule_search.cli"]

    def run(*args: str) -> None:
        done = subprocess.run([*cli, *args, "--storage", storage], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]

    # Tuned on 2 workers, transferred on 1 (below): the window is rescaled to keep the
    # recipe's tokens per optimizer step.
    run("sweep", str(tmp_path / "space.yaml"), "--workers", "2")

    # SIGKILL during export, at moments spread over its run: the recipe is never half written.
    recipe = tmp_path / "runs" / "lt" / "recipe.yaml"
    for delay in (1.5, 3.0):
        exporting = subprocess.Popen(
            [*cli, "export", "lt", "--storage", storage],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(delay)
        exporting.kill()
        exporting.wait()
        if recipe.exists():
            load_recipe(recipe)  # complete, or it would not load
    run("export", "lt")
    uneven = subprocess.run(
        [*cli, "transfer", "lt", "--workers", "3", "--storage", storage],
        capture_output=True,
        text=True,
    )
    assert uneven.returncode == 2 and len(uneven.stderr.strip().splitlines()) == 1
    assert "--workers 3: the recipe steps every 4 micro-batches" in uneven.stderr
    assert not (tmp_path / "runs" / "lt" / "transfer").exists()  # nothing launched

    # SIGKILL of the transfer's driver (and its Ray) once some runs have finished; run it again.
    transfer = [
        *cli,
        "transfer",
        "lt",
        "--to",
        "2",
        "--workers",
        "1",
        "--concurrency",
        "2",
        "--methods",
        "recipe,constant,cosine,wsd",
        "--storage",
        storage,
    ]
    first = Experiment(tmp_path / "runs" / "lt" / "transfer" / "phase1")
    driver = subprocess.Popen(
        transfer, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 300
    while (
        not first.root.exists()
        or sum(1 for t in first.trial_ids() if first.read_trial_json(t, "result.json")) < 2
    ):
        assert driver.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    finished = {
        t: first.read_trial_json(t, "result.json")
        for t in first.trial_ids()
        if first.read_trial_json(t, "result.json")
    }
    done = subprocess.run(transfer, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    for trial_id, result in finished.items():  # finished runs are kept, not redone
        assert first.read_trial_json(trial_id, "result.json") == result

    root = tmp_path / "runs" / "lt" / "transfer"
    # Asking the finished transfer for other horizons is refused: it would change its runs.
    other = subprocess.run(
        [*cli, "transfer", "lt", "--to", "4", "--storage", storage], capture_output=True, text=True
    )
    assert other.returncode == 2 and "Move that folder aside" in other.stderr, other.stderr
    assert len(other.stderr.strip().splitlines()) == 1
    for name in ("transfer.md", "transfer.json"):
        assert (root / name).stat().st_size > 0
    for name in ("loss_vs_tokens.png", "lr_curves.png"):
        assert (root / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (
            root / name
        ).stat().st_size > 5000
    table = json.loads((root / "transfer.json").read_text())
    assert table["horizons"] == [1.0, 2.0]

    second = Experiment(root / "phase2")
    names = run_names(first)
    for trial_id in names.values():
        config = first.read_trial_json(trial_id, "config.json")["config"]
        assert config["window"]["microbatches"] == 4  # 2 per rank on 2 workers -> 4 on 1
    windows = [json.loads(x) for x in (first.trial_dir(names["recipe"]) / "windows.jsonl").open()]
    assert {w["tokens"] for w in windows} == {4 * 16}
    assert len(names) == 2 + 6  # recipe, constant, 3 LRs x 2 horizons
    for h in ("1", "2"):  # the envelope is the best cosine at its own horizon, read back here
        finals = [
            first.read_trial_json(t, "metrics.json")[-1]["val_loss"]
            for n, t in names.items()
            if n.startswith(f"cosine-{h}x-")
        ]
        assert table["loss"]["cosine envelope"][h] == min(finals)

    constant = names["constant"]
    checkpoints = ckpt.checkpoint_folders(first.train_run_dir(constant))
    for run, trial_id in run_names(second).items():
        h = float(run.removeprefix("wsd-").removesuffix("x"))
        config = parse(TrainConfig, second.read_trial_json(trial_id, "config.json")["config"], run)
        branch_tokens = 0.9 * h * 20 * 64
        expected = min(
            c for c in checkpoints if int(c.name.removeprefix("checkpoint_")) >= branch_tokens
        )
        assert config.branch_from == str(expected)
        trunk = ckpt.load_state(expected)
        events = [json.loads(x) for x in (second.trial_dir(trial_id) / "events.jsonl").open()]
        assert (
            events[0]["event"] == "branched"
            and events[0]["tokens"] == trunk["window"]["tokens_seen"]
        )
        # The branch's LR is the WSD formula at the token clock, window by window.
        schedule = Wsd(Warmup(0.05 * 80), h * 80, 0.1, 0.1)  # 80 reference steps (16 tokens) in 1x
        tokens = trunk["window"]["tokens_seen"]
        windows = [json.loads(x) for x in (second.trial_dir(trial_id) / "windows.jsonl").open()]
        assert windows and windows[0]["index"] == trunk["window"]["windows"]
        for record in windows:
            assert record["lr"] == pytest.approx(
                config.optimizer.lr * schedule(tokens / 16), rel=1e-12
            )
            tokens += record["tokens"]
        # It decays: windows of 64 tokens (4 reference steps) in a decay of 8h reference
        # steps; the last window starts at least half-way through it, below 55% of peak.
        decaying = [w["lr"] for w in windows if w["lr"] < config.optimizer.lr]
        assert decaying and decaying == sorted(decaying, reverse=True)
        assert windows[-1]["lr"] <= 0.55 * config.optimizer.lr * (1 + 1e-12)
