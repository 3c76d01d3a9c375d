"""Transfer: the plan, the envelope, and a real (small) transfer on linreg through Ray."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from schedule_search import checkpoint as ckpt
from schedule_search.config import parse
from schedule_search.experiment import Experiment
from schedule_search.launch import run_local
from schedule_search.recipe import load_recipe
from schedule_search.report import transfer_table
from schedule_search.schedules import Warmup, Wsd
from schedule_search.train import TrainConfig
from schedule_search.transfer import run_names, transfer_base
from schedule_search.transfer_plan import TransferStudy

BASE = parse(
    TrainConfig,
    {
        "task": {"name": "linreg", "dim": 64, "batch": 16},
        "optimizer": {"name": "sgd", "lr": 0.1},
        "schedule": {"kind": "poly", "gamma": 0.3, "alpha": 4.0, "warmup": 0.05},
        "ema": {"fractions": [0.0, 0.04], "objective": 0.04},
        "window": {"microbatches": 2},
        "budget": {"horizon": 1.0, "eval_at": [0.5]},
    },
    "test",
)
ALL = ["recipe", "constant", "schedulefree", "cosine", "linear", "wsd"]


def study(**changes) -> TransferStudy:
    args = {"horizons": [1.0, 2.0, 4.0], "methods": ALL, "sweep_horizon": 1.0} | changes
    return TransferStudy(BASE, **args)


def no_checkpoints(run: str, multiple: float):
    raise AssertionError(f"no checkpoint may be asked for in the first round ({run})")


def history(*points, key="val_loss_raw"):
    return [{"chinchilla": h, "tokens": int(h * 100), key: v, "val_loss": v} for h, v in points]


def test_the_first_round_trains_the_recipe_the_trunk_and_the_grid_start_points():
    s = study(continue_from="/sweep/train/run-x/checkpoint_000000000001280")
    first = s.pending({}, no_checkpoints)
    recipe = first["recipe"]
    assert recipe["branch_from"] == s.continue_from and recipe["budget"]["horizon"] == 4.0
    assert recipe["schedule"]["gamma"] == 0.3 and recipe["ema"]["objective"] == 0.04
    constant = first["constant"]
    assert constant["schedule"]["kind"] == "constant"
    # Both WSD branch points of every horizon are evaluations, so checkpoints, of the trunk.
    assert {0.9, 1.8, 3.6, 0.8, 1.6, 3.2} <= set(constant["budget"]["eval_at"])
    assert constant["checkpoint"]["keep"] >= len(constant["budget"]["eval_at"]) + 1
    # Cosine's grid at the first horizon is centred on the recipe's LR; the later ones wait
    # for the best LR of the horizon before.
    cosines = {n: c for n, c in first.items() if n.startswith("cosine-")}
    assert sorted(cosines) == ["cosine-1x-lr0.05", "cosine-1x-lr0.1", "cosine-1x-lr0.2"]
    for c in cosines.values():
        assert c["schedule"]["horizon"] == c["budget"]["horizon"] == 1.0
        assert c["ema"]["objective"] == 0.0 and len(c["ema"]["fractions"]) >= 7
    schedule_free = {n: c for n, c in first.items() if n.startswith("schedulefree-")}
    assert sorted(c["optimizer"]["lr"] for c in schedule_free.values()) == [0.05, 0.1, 0.2]
    for c in schedule_free.values():
        assert c["optimizer"]["name"] == "schedulefree_adamw"
        assert c["schedule"]["kind"] == "constant" and c["budget"]["horizon"] == 1.0
    assert not any(n.startswith(("linear-", "wsd")) for n in first)


def finish(s, finished, loss_of):
    """Finish every pending grid run with a synthetic final loss of (kind, horizon, lr)."""
    for name, config in s.pending(finished, lambda run, m: Path(f"/{run}/{m:g}")).items():
        h, lr = config["budget"]["horizon"], config["optimizer"]["lr"]
        kind = config["optimizer"]["name"] if "schedulefree" in name else name.split("-")[0]
        finished[name] = history((h, loss_of(kind, h, lr)))
    return finished


def test_grids_extend_at_an_edge_and_start_around_the_best_they_are_centred_on():
    s = study(methods=["cosine", "linear"])

    def loss(kind, h, lr):  # cosine is best near 0.25 (beyond the edge), linear near 0.45
        target = 0.25 if kind == "cosine" else 0.45
        return (math.log2(lr) - math.log2(target)) ** 2

    finished = finish(s, {}, loss)
    assert sorted(finished) == ["cosine-1x-lr0.05", "cosine-1x-lr0.1", "cosine-1x-lr0.2"]
    assert s.centre("cosine", 2.0, finished) is None  # the best is at the edge: not settled
    assert sorted(s.pending(finished, no_checkpoints)) == ["cosine-1x-lr0.4"]
    finished = finish(s, finished, loss)  # 0.2 is now interior: cosine at 1x settled
    second = s.pending(finished, no_checkpoints)
    for prefix in ("cosine-2x", "linear-1x"):  # x0.5, x1, x2 of cosine's best at 1x
        lrs = sorted(c["optimizer"]["lr"] for n, c in second.items() if n.startswith(prefix))
        assert lrs == [0.1, 0.2, 0.4], prefix
    assert second["linear-1x-lr0.2"]["schedule"]["kind"] == "linear"
    assert not any(n.startswith(("cosine-4x", "linear-2x")) for n in second)
    while s.pending(finished, no_checkpoints):
        finished = finish(s, finished, loss)
    for h in (1, 2, 4):
        assert f"linear-{h}x-lr0.8" in finished  # each extended once past its best (0.4)
    # Centred on the horizon before, the later cosine grids were interior at once.
    assert not any(n.startswith(("cosine-2x", "cosine-4x")) and "lr0.05" in n for n in finished)
    assert not any(n.startswith("cosine") and "lr0.8" in n for n in finished)
    assert s.pending(finished, no_checkpoints) == {}


def test_wsd_branches_and_schedule_free_continue_from_checkpoints():
    s = study(methods=["constant", "schedulefree", "wsd"])
    asked = []

    def checkpoint_at(run, multiple):
        asked.append((run, round(multiple, 6)))
        return Path(f"/ckpt/{run}/{multiple:g}")

    finished = {"constant": history((1.0, 1.0), (2.0, 0.9), (4.0, 0.8))}
    for lr, loss in ((0.05, 1.2), (0.1, 1.0), (0.2, 1.1)):
        finished[f"schedulefree-lr{lr:g}"] = history((1.0, loss))
    runs = s.pending(finished, checkpoint_at)
    assert sorted(runs) == [
        "schedulefree",
        "wsd-1x",
        "wsd-2x",
        "wsd-4x",
        "wsd-sqrt-1x",
        "wsd-sqrt-2x",
        "wsd-sqrt-4x",
    ]
    assert ("constant", 3.6) in asked and ("constant", 3.2) in asked
    sqrt = runs["wsd-sqrt-4x"]["schedule"]
    assert sqrt["cooldown"] == "sqrt" and sqrt["decay_fraction"] == 0.2 and sqrt["floor"] == 0.0
    linear = runs["wsd-4x"]["schedule"]
    assert linear["cooldown"] == "linear" and linear["decay_fraction"] == 0.1
    assert runs["wsd-4x"]["branch_from"] == "/ckpt/constant/3.6"
    continued = runs["schedulefree"]
    assert continued["optimizer"]["lr"] == 0.1 and continued["budget"]["horizon"] == 4.0
    assert continued["branch_from"] == "/ckpt/schedulefree-lr0.1/1"


def test_the_table_scores_each_row_by_its_protocol_against_both_envelopes():
    s = study(methods=["recipe", "cosine", "linear"], horizons=[1.0, 2.0], continue_from="/c")
    s.continued_trial = "abc"
    runs = {
        "recipe": [
            {
                "chinchilla": 2.0,
                "tokens": 200,
                "val_loss": 2.0,
                "val_loss_ema/0.04": 2.05,
                "val_loss_raw": 2.3,
            }
        ],
        "cosine-1x-lr0.05": history((1.0, 3.0)),
        "cosine-1x-lr0.1": history((1.0, 2.5)),
        "cosine-1x-lr0.2": history((1.0, math.nan)),  # a diverged run does not count
        "cosine-1x-lr0.025": history((1.0, 2.8)),
        "cosine-2x-lr0.05": history((1.0, 2.9), (2.0, 2.2)),
        "cosine-2x-lr0.1": history((1.0, 2.7), (2.0, 2.4)),
        "cosine-2x-lr0.2": history((1.0, 2.8), (2.0, 2.45)),
        "cosine-2x-lr0.025": history((2.0, 2.3)),
        "linear-1x-lr0.05": history((1.0, 2.6)),
        "linear-1x-lr0.1": history((1.0, 2.4)),
        "linear-1x-lr0.2": history((1.0, 2.45)),
        "linear-2x-lr0.025": history((2.0, 2.35)),
        "linear-2x-lr0.05": history((2.0, 2.25)),
        "linear-2x-lr0.1": history((2.0, 2.3)),
    }
    runs["cosine-2x-lr0.05"][-1]["val_loss_ema/0.02"] = 2.1  # its best EMA
    sweep = [{"chinchilla": 1.0, "tokens": 100, "val_loss": 2.6, "val_loss_ema/0.04": 2.55}]
    table = transfer_table(s, runs, sweep)
    rows = table["rows"]
    recipe = rows["recipe (continued from trial abc at 1x)"]
    assert recipe["loss"] == {"1": 2.55, "2": 2.05}  # its own fraction, 1x from the sweep
    assert recipe["compute"] == 1.0  # 2x - the 1x the sweep trained
    assert rows["cosine envelope (last iterate)"]["loss"] == {"1": 2.5, "2": 2.2}
    assert rows["linear-to-zero envelope (last iterate)"]["loss"] == {"1": 2.4, "2": 2.25}
    assert rows["envelope (best of both, last iterate)"]["loss"] == {"1": 2.4, "2": 2.2}
    assert rows["envelope with EMA (each run's best EMA)"]["loss"] == {"1": 2.4, "2": 2.1}
    assert recipe["gap_last"]["2"] == pytest.approx(2.05 - 2.2)
    assert recipe["gap_ema"]["2"] == pytest.approx(2.05 - 2.1)
    # The cosine tuned for the largest horizon, seen at the smaller one:
    assert rows["cosine tuned for 2x (last iterate)"]["loss"]["1"] == 2.9
    assert table["envelope_runs"]["cosine"]["last"]["2"] == {
        "run": "cosine-2x-lr0.05",
        "interior": True,
    }


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_small_transfer_on_linreg(tmp_path):
    space = {
        "name": "lt",
        "samples": 1,
        "base": {
            "task": {"name": "linreg", "dim": 64, "batch": 16},
            "optimizer": {"name": "sgd", "lr": 0.1},
            "schedule": {"kind": "poly", "alpha": 4.0, "warmup": 0.05, "gamma": 0.5},
            "ema": {"fractions": [0.0, 0.04], "objective": "best"},
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

    run("sweep", str(tmp_path / "space.yaml"), "--workers", "1")
    sweep = Experiment(tmp_path / "runs" / "lt")

    # SIGKILL during export, at moments spread over its run: the recipe is never half written.
    recipe = sweep.root / "recipe.yaml"
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
    assert "--workers 3: the recipe steps every 2 micro-batches" in uneven.stderr
    assert not (sweep.root / "transfer").exists()  # nothing launched
    # On another number of workers the window keeps the recipe's tokens per step.
    assert transfer_base(sweep, 2)[0].window.microbatches == 1

    # SIGKILL of the transfer's driver (and its Ray) once a run has finished and another has
    # started but not yet evaluated (its config written, no metrics); run it again.
    # Linear-to-zero grids and schedule-free AdamW go through the same rounds (their plans and
    # the table are tested above, their runs in test_train); left out here to keep this short.
    transfer = [*cli, "transfer", "lt", "--to", "2", "--concurrency", "2", "--storage", storage]
    transfer += ["--methods", "recipe,constant,cosine,wsd"]
    first = Experiment(sweep.root / "transfer" / "round1")
    driver = subprocess.Popen(
        transfer, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 300

    def states() -> dict[str, str]:
        if not first.root.exists():
            return {}
        return {row.trial_id: row.state for row in first.rows(2.0)}

    while not ("completed" in states().values() and "pending" in (at_kill := states()).values()):
        assert driver.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    finished = {
        t: first.read_trial_json(t, "result.json")
        for t in first.trial_ids()
        if first.read_trial_json(t, "result.json")
    }
    never_evaluated = [t for t, state in at_kill.items() if state == "pending"]
    assert never_evaluated and not any(
        first.read_trial_json(t, "metrics.json") for t in never_evaluated
    )
    done = subprocess.run(transfer, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    for trial_id, result in finished.items():  # finished runs are kept, not redone
        assert first.read_trial_json(trial_id, "result.json") == result
    for trial_id in never_evaluated:  # killed before its first evaluation: run to its end
        assert first.read_trial_json(trial_id, "result.json")["state"] == "completed"

    root = sweep.root / "transfer"
    # Asking the finished transfer for other horizons is refused: it would change its runs.
    methods = ["--methods", "recipe,constant,cosine,wsd"]
    other = subprocess.run(
        [*cli, "transfer", "lt", "--to", "4", *methods, "--storage", storage],
        capture_output=True,
        text=True,
    )
    assert other.returncode == 2 and "Move that folder aside" in other.stderr, other.stderr
    assert len(other.stderr.strip().splitlines()) == 1
    for name in ("loss_vs_tokens.png", "lr_curves.png"):
        assert (root / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = json.loads((root / "transfer.json").read_text())
    assert table["horizons"] == [1.0, 2.0]
    runs = check_every_run_is_audited(root, table)
    check_envelopes(table, runs)
    check_the_recipe_continued(sweep, root, table, runs)
    check_wsd_branches(runs)


def read_runs(root: Path) -> dict:
    """run name -> (its round's Experiment, trial id), over every round."""
    out = {}
    for folder in sorted(root.glob("round*")):
        phase = Experiment(folder)
        out.update({name: (phase, trial) for name, trial in run_names(phase).items()})
    return out


def check_every_run_is_audited(root: Path, table: dict) -> dict:
    """transfer.json holds every run's loss at every horizon it reached, as the run recorded
    it, with its LR, schedule and compute."""
    runs = read_runs(root)
    assert set(table["runs"]) == set(runs)
    for name, (phase, trial) in runs.items():
        entry = table["runs"][name]
        assert entry["where"] == f"{phase.root.name}/{trial}"
        history = phase.read_trial_json(trial, "metrics.json")
        recorded = {f"{r['chinchilla']:g}": r["val_loss"] for r in history}
        assert {h: v["objective"] for h, v in entry["losses"].items()} == recorded
        config = phase.read_trial_json(trial, "config.json")["config"]
        assert entry["lr"] == config["optimizer"]["lr"]
        assert entry["schedule"] == config["schedule"] and entry["compute"] > 0
    return runs


def check_envelopes(table: dict, runs: dict) -> None:
    for kind, label in (("cosine", "cosine"),):
        for h in ("1", "2"):
            finals = []
            for name, (phase, trial) in runs.items():
                if name.startswith(f"{kind}-{h}x-"):
                    last = phase.read_trial_json(trial, "metrics.json")[-1]
                    finals.append(last["val_loss_raw"])
            envelope = table["rows"][f"{label} envelope (last iterate)"]["loss"][h]
            assert envelope == min(finals) and len(finals) >= 3
            best = table["envelope_runs"][kind]["last"][h]
            lrs = sorted(
                float(n.rsplit("-lr", 1)[1]) for n in runs if n.startswith(f"{kind}-{h}x-")
            )
            best_lr = float(best["run"].rsplit("-lr", 1)[1])
            assert best["interior"] == (lrs[0] < best_lr < lrs[-1])
            if not best["interior"]:  # the bound was hit: two x2 steps beyond the start grid
                assert len(lrs) == 5


def check_the_recipe_continued(sweep: Experiment, root: Path, table: dict, runs: dict) -> None:
    """The recipe's run starts from the sweep trial's checkpoint at 1x (same config, same
    tokens per step) and ends where a run never stopped ends."""
    plan = json.loads((root / "plan.json").read_text())
    trial = plan["recipe_trial"]
    checkpoint = Path(plan["continued_from"])
    assert checkpoint.parent == sweep.train_run_dir(trial)
    state = ckpt.load_state(checkpoint)
    assert state["progress"]["status"] == "completed"  # the sweep trial's end, at 1x
    phase, trial_id = runs["recipe"]
    events = [json.loads(x) for x in (phase.trial_dir(trial_id) / "events.jsonl").open()]
    assert events[0] == {
        "event": "branched",
        "from": str(checkpoint),
        "tokens": state["window"]["tokens_seen"],
    }
    windows = [json.loads(x) for x in (phase.trial_dir(trial_id) / "windows.jsonl").open()]
    assert windows[0]["index"] == state["window"]["windows"]
    label = next(r for r in table["rows"] if r.startswith("recipe (continued from trial"))
    assert trial in label and table["rows"][label]["compute"] == 1.0
    config = phase.read_trial_json(trial_id, "config.json")["config"]
    straight = dict(config, branch_from=None)
    history = run_local(parse(TrainConfig, straight, "straight"), root.parent / "straight").history
    continued = phase.read_trial_json(trial_id, "metrics.json")
    assert continued[-1]["val_loss"] == history[-1]["val_loss"]  # bit for bit
    assert continued[-1]["tokens"] == history[-1]["tokens"]


def check_wsd_branches(runs: dict) -> None:
    phase, constant = runs["constant"]
    checkpoints = ckpt.checkpoint_folders(phase.train_run_dir(constant))
    for run in [n for n in runs if n.startswith("wsd")]:
        branch_phase, trial_id = runs[run]
        config = parse(
            TrainConfig, branch_phase.read_trial_json(trial_id, "config.json")["config"], run
        )
        h = config.schedule.horizon
        share = config.schedule.decay_fraction
        assert (share, config.schedule.cooldown) in ((0.1, "linear"), (0.2, "sqrt"))
        branch_tokens = (1 - share) * h * 20 * 64
        expected = min(
            c for c in checkpoints if int(c.name.removeprefix("checkpoint_")) >= branch_tokens
        )
        assert config.branch_from == str(expected)
        trunk = ckpt.load_state(expected)
        # The branch's LR is its WSD formula at the token clock, window by window.
        schedule = Wsd(
            Warmup(0.05 * 80), h * 80, share, config.schedule.floor, config.schedule.cooldown
        )
        tokens = trunk["window"]["tokens_seen"]
        windows = [
            json.loads(x) for x in (branch_phase.trial_dir(trial_id) / "windows.jsonl").open()
        ]
        assert windows and windows[0]["index"] == trunk["window"]["windows"]
        for record in windows:
            assert record["lr"] == pytest.approx(
                config.optimizer.lr * schedule(tokens / 16), rel=1e-12
            )
            tokens += record["tokens"]
        decaying = [w["lr"] for w in windows if w["lr"] < config.optimizer.lr]
        assert decaying and decaying == sorted(decaying, reverse=True)
