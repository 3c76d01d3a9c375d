"""Transfer without running it: the plan's rounds (the recipe, the trunk, LR grids extended
at an edge, WSD branches and schedule-free continued from checkpoints) and the table that
scores them (a real, small transfer: tests/integration/transfer/test_transfer.py)."""

import math
from pathlib import Path

import pytest

from schedule_search.core.config import parse, to_dict
from schedule_search.report.transfer import transfer_table
from schedule_search.train.config import TrainConfig
from schedule_search.train.evaluation import Evaluation
from schedule_search.transfer.plan import TransferStudy

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
    return [
        Evaluation.from_metrics({"chinchilla": h, "tokens": int(h * 100), key: v, "val_loss": v})
        for h, v in points
    ]


def test_the_first_round_trains_the_recipe_the_trunk_and_the_grid_start_points():
    s = study(continue_from="/sweep/train/run-x/checkpoint_000000000001280")
    first = s.pending({}, no_checkpoints)
    recipe = first["recipe"]
    assert recipe["branch_from"] == s.continue_from and recipe["budget"]["horizon"] == 4.0
    # The recipe runs as it was exported: all but its budget and start is the base config.
    exported = {k: v for k, v in to_dict(BASE).items() if k not in ("budget", "branch_from")}
    assert {k: v for k, v in recipe.items() if k not in ("budget", "branch_from")} == exported
    assert recipe["schedule"]["gamma"] == 0.3 and recipe["ema"]["objective"] == 0.04
    constant = first["constant"]
    assert constant["schedule"]["kind"] == "constant"
    # Both WSD branch points of every horizon are evaluations, so checkpoints, of the trunk.
    assert {0.9, 1.8, 3.6, 0.8, 1.6, 3.2} <= set(constant["budget"]["eval_at"])
    assert constant["checkpoint"]["keep"] >= len(constant["budget"]["eval_at"]) + 1
    # Both horizon-aware grids at the first horizon are centred on the recipe's LR; the later
    # ones wait for the best LR of the horizon before.
    for kind in ("cosine", "linear"):
        grid = {n: c for n, c in first.items() if n.startswith(f"{kind}-")}
        assert sorted(grid) == [f"{kind}-1x-lr0.05", f"{kind}-1x-lr0.1", f"{kind}-1x-lr0.2"]
        for c in grid.values():
            assert c["schedule"]["kind"] == kind
            assert c["schedule"]["horizon"] == c["budget"]["horizon"] == 1.0
            assert c["ema"]["objective"] == 0.0 and len(c["ema"]["fractions"]) >= 7
    # Schedule-free AdamW's grid: x0.5, x1, x2 of sqrt(10) times the recipe's LR, the middle
    # of the 1x-10x its authors advise.
    schedule_free = {n: c for n, c in first.items() if n.startswith("schedulefree-")}
    lrs = sorted(c["optimizer"]["lr"] for c in schedule_free.values())
    assert lrs == pytest.approx([0.1 * math.sqrt(10) * f for f in (0.5, 1, 2)], rel=1e-5)
    for c in schedule_free.values():
        assert c["optimizer"]["name"] == "schedulefree_adamw"
        assert c["schedule"]["kind"] == "constant" and c["budget"]["horizon"] == 1.0
    assert not any(n.startswith(("cosine-2x", "linear-2x", "wsd")) for n in first)


def finish(s, finished, loss_of):
    """Finish every pending grid run with a synthetic final loss of (kind, horizon, lr)."""
    for name, config in s.pending(finished, lambda run, m: Path(f"/{run}/{m:g}")).items():
        h, lr = config["budget"]["horizon"], config["optimizer"]["lr"]
        kind = config["optimizer"]["name"] if "schedulefree" in name else name.split("-")[0]
        finished[name] = history((h, loss_of(kind, h, lr)))
    return finished


def lrs_of(runs, prefix):
    """The LRs of the pending runs whose names start with `prefix`."""
    return sorted(c["optimizer"]["lr"] for n, c in runs.items() if n.startswith(prefix))


def ran(finished, grid):
    """The LRs the finished runs of `grid` (e.g. "cosine-2x") ran at, read from their names."""
    return sorted(float(n.removeprefix(f"{grid}-lr")) for n in finished if n.startswith(grid))


def test_grids_extend_at_an_edge_and_the_next_horizon_centres_on_the_best_of_both():
    s = study(methods=["cosine", "linear"])

    def loss(kind, h, lr):  # cosine is best near 0.25 (beyond the edge), linear near 0.45
        target = 0.25 if kind == "cosine" else 0.45
        return (math.log2(lr) - math.log2(target)) ** 2

    finished = finish(s, {}, loss)
    assert len(finished) == 6  # both grids of the first horizon, side by side
    assert s.centre(2.0, finished) is None  # their best is at an edge: not settled
    assert sorted(s.pending(finished, no_checkpoints)) == ["cosine-1x-lr0.4", "linear-1x-lr0.4"]
    finished = finish(s, finished, loss)  # cosine's 0.2 is now interior; linear's 0.4 is not
    assert sorted(s.pending(finished, no_checkpoints)) == ["linear-1x-lr0.8"]
    finished = finish(s, finished, loss)
    # Summed over both kinds, 0.4 has the lowest loss at 1x (cosine alone would pick 0.2);
    # 0.8, which only linear ran, is not a candidate.
    assert s.centre(2.0, finished) == 0.4
    second = s.pending(finished, no_checkpoints)
    assert lrs_of(second, "cosine-2x") == lrs_of(second, "linear-2x") == [0.2, 0.4, 0.8]
    assert not lrs_of(second, "cosine-4x")
    while s.pending(finished, no_checkpoints):
        finished = finish(s, finished, loss)
    for h in (2, 4):  # cosine's best (0.2) was at the low edge: extended once; linear interior
        assert ran(finished, f"cosine-{h}x") == [0.1, 0.2, 0.4, 0.8]
        assert ran(finished, f"linear-{h}x") == [0.2, 0.4, 0.8]
    assert s.pending(finished, no_checkpoints) == {}

    # With one kind only, the centre is that kind's best, extensions included.
    alone = study(methods=["cosine"])
    finished = finish(alone, {}, loss)
    finished = finish(alone, finished, loss)
    assert alone.centre(2.0, finished) == 0.2


def test_wsd_branches_and_schedule_free_continue_from_checkpoints():
    s = study(methods=["constant", "schedulefree", "wsd"])
    asked = []

    def checkpoint_at(run, multiple):
        asked.append((run, round(multiple, 6)))
        return Path(f"/ckpt/{run}/{multiple:g}")

    finished = {"constant": history((1.0, 1.0), (2.0, 0.9), (4.0, 0.8))}
    grid = s.schedulefree_grid()
    for lr, loss in zip(grid.start, (1.2, 1.0, 1.1), strict=True):
        finished[grid.run_name(lr)] = history((1.0, loss))
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
    best = grid.start[1]  # the middle of its grid won at the sweep's horizon
    assert continued["optimizer"]["lr"] == best and continued["budget"]["horizon"] == 4.0
    assert continued["branch_from"] == f"/ckpt/{grid.run_name(best)}/1"

    # Replaying this round on resume, with what ended in it read back: the trunks'
    # checkpoints (pruned since) are not looked up, and nothing of it is pending again.
    assert s.pending(finished, no_checkpoints, frozenset(runs)) == {}
    partly = s.pending(finished, checkpoint_at, frozenset(["wsd-4x", "schedulefree"]))
    assert "wsd-4x" not in partly and "schedulefree" not in partly and "wsd-2x" in partly

    # Once the branches and the continuation have finished, their trunks' checkpoints are
    # not looked up again (they may have been pruned), and nothing is left to run.
    for name in runs:
        finished[name] = history((4.0, 0.7))
    assert s.pending(finished, no_checkpoints) == {}


def test_the_table_scores_each_row_by_its_protocol_against_both_envelopes():
    s = study(methods=["recipe", "cosine", "linear"], horizons=[1.0, 2.0], continue_from="/c")
    s.continued_trial = "abc"
    runs = {
        "recipe": [
            Evaluation.from_metrics(
                {
                    "chinchilla": 2.0,
                    "tokens": 200,
                    "val_loss": 2.0,
                    "val_loss_ema/0.04": 2.05,
                    "val_loss_raw": 2.3,
                }
            )
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
    runs["cosine-2x-lr0.05"][-1].losses[0.02] = 2.1  # its best EMA
    sweep = [
        Evaluation.from_metrics(
            {"chinchilla": 1.0, "tokens": 100, "val_loss": 2.6, "val_loss_ema/0.04": 2.55}
        )
    ]
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


def test_a_schedule_free_recipe_is_its_own_row_and_the_references_train_adamw():
    """The recipe a sweep over families returns may be schedule-free AdamW: it is then the
    schedule-free row (not run twice), and the constant trunk, WSD and the envelopes train
    AdamW (its own betas) from the recipe's LR over sqrt(10), the middle of schedule-free's
    advised 1x-10x read backwards."""
    tree = to_dict(BASE)
    tree["optimizer"] = {"name": "schedulefree_adamw", "lr": 0.1, "betas": [0.98, 0.95]}
    tree["schedule"] = {"kind": "constant", "warmup": 0.2}
    s = TransferStudy(parse(TrainConfig, tree, "test"), [1.0, 2.0], ALL, 1.0)
    assert "schedulefree" not in s.methods
    first = s.pending({}, no_checkpoints)
    assert first["recipe"]["optimizer"]["name"] == "schedulefree_adamw"
    assert not [name for name in first if name.startswith("schedulefree")]
    adamw_lr = 0.1 / math.sqrt(10)
    for name in ("constant", "cosine-1x-lr0.0316228", "linear-1x-lr0.0632456"):
        optimizer = first[name]["optimizer"]
        assert optimizer["name"] == "adamw" and tuple(optimizer["betas"]) == (0.9, 0.95)
        assert first[name]["schedule"]["warmup"] == 0.2  # the recipe's warmup
    assert math.isclose(first["constant"]["optimizer"]["lr"], adamw_lr)
