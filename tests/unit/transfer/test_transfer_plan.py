"""Transfer without running it: the plan's rounds (the recipe, the trunk, LR grids extended
at an edge, WSD branches and schedule-free continued from checkpoints) and the table that
scores them (a real, small transfer: tests/integration/transfer/test_transfer.py)."""

import math
from pathlib import Path

import pytest

from schedule_search.core.config import ConfigError, parse, to_dict
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
    # Constant + EMA's LR is picked at the sweep's horizon on a grid around the recipe's LR;
    # the WSD branch points before that horizon are evaluations, so checkpoints, of each run.
    assert "constant" not in first
    constant = {n: c for n, c in first.items() if n.startswith("constant-")}
    assert sorted(constant) == ["constant-lr0.05", "constant-lr0.1", "constant-lr0.2"]
    for c in constant.values():
        assert c["schedule"]["kind"] == "constant" and c["budget"]["horizon"] == 1.0
        assert c["ema"]["objective"] == 0.0 and len(c["ema"]["fractions"]) >= 7
        assert {0.9, 0.8} <= set(c["budget"]["eval_at"])
        assert c["checkpoint"]["keep"] >= len(c["budget"]["eval_at"]) + 1
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


def test_constant_lr_is_picked_by_its_banks_best_and_continued_and_wsd_branches_off_it():
    """The constant trunk's grid at the sweep's horizon is scored like its row (the bank's
    best, not the raw weights) and extended where that best is at an edge; the winner is
    continued from its checkpoint at the sweep's horizon, and each WSD branch starts from the
    grid's winner before that horizon and from the continuation after it."""
    s = study(methods=["constant", "schedulefree", "wsd"])
    asked = []

    def checkpoint_at(run, multiple):
        asked.append((run, round(multiple, 6)))
        return Path(f"/ckpt/{run}/{multiple:g}")

    def constant_run(raw, ema):
        run = history((0.8, raw + 0.1), (0.9, raw + 0.05), (1.0, raw))
        run[-1].losses[0.04] = ema
        return run

    # Raw weights would pick 0.05 (a low edge); the bank's best picks 0.2, at the high edge
    # (the recipe's LR is 0.1): extended to 0.4 before anything branches off the grid.
    finished = {
        "constant-lr0.05": constant_run(1.00, 0.98),
        "constant-lr0.1": constant_run(1.05, 0.96),
        "constant-lr0.2": constant_run(1.10, 0.95),
    }
    grid = s.schedulefree_grid()
    for lr, loss in zip(grid.start, (1.2, 1.0, 1.1), strict=True):
        finished[grid.run_name(lr)] = history((1.0, loss))
    assert s.trunk_lr(finished) is None
    assert sorted(s.pending(finished, checkpoint_at)) == ["constant-lr0.4", "schedulefree"]
    finished["constant-lr0.4"] = constant_run(1.20, 0.97)
    assert s.trunk_lr(finished) == 0.2
    runs = s.pending(finished, checkpoint_at)
    assert sorted(runs) == ["constant", "schedulefree", "wsd-1x", "wsd-sqrt-1x"]
    trunk = runs["constant"]
    assert trunk["optimizer"]["lr"] == 0.2 and trunk["budget"]["horizon"] == 4.0
    assert trunk["branch_from"] == "/ckpt/constant-lr0.2/1"
    # The branch points after the sweep's horizon are evaluations, so checkpoints, of it.
    assert {1.8, 3.6, 1.6, 3.2} <= set(trunk["budget"]["eval_at"])
    assert runs["wsd-1x"]["branch_from"] == "/ckpt/constant-lr0.2/0.9"
    assert runs["wsd-sqrt-1x"]["branch_from"] == "/ckpt/constant-lr0.2/0.8"
    assert runs["wsd-1x"]["optimizer"]["lr"] == runs["wsd-sqrt-1x"]["optimizer"]["lr"] == 0.2
    sqrt = runs["wsd-sqrt-1x"]["schedule"]
    assert sqrt["cooldown"] == "sqrt" and sqrt["decay_fraction"] == 0.2 and sqrt["floor"] == 0.0
    linear = runs["wsd-1x"]["schedule"]
    assert linear["cooldown"] == "linear" and linear["decay_fraction"] == 0.1
    continued = runs["schedulefree"]
    best = grid.start[1]  # the middle of its grid won at the sweep's horizon
    assert continued["optimizer"]["lr"] == best and continued["budget"]["horizon"] == 4.0
    assert continued["branch_from"] == f"/ckpt/{grid.run_name(best)}/1"

    # Replaying this round on resume, with what ended in it read back: the trunks'
    # checkpoints (pruned since) are not looked up, and nothing of it is pending again.
    assert s.pending(finished, no_checkpoints, frozenset(runs)) == {}
    partly = s.pending(finished, checkpoint_at, frozenset(["wsd-1x", "schedulefree"]))
    assert sorted(partly) == ["constant", "wsd-sqrt-1x"]

    for name in runs:
        finished[name] = history((1.8, 0.9), (3.2, 0.85), (3.6, 0.8), (4.0, 0.7))
    later = s.pending(finished, checkpoint_at)
    assert sorted(later) == ["wsd-2x", "wsd-4x", "wsd-sqrt-2x", "wsd-sqrt-4x"]
    assert later["wsd-4x"]["branch_from"] == "/ckpt/constant/3.6"
    assert {c["optimizer"]["lr"] for c in later.values()} == {0.2}
    assert ("constant", 3.2) in asked
    for name in later:
        finished[name] = history((4.0, 0.7))
    assert s.pending(finished, no_checkpoints) == {}


def test_a_constant_grid_whose_banks_best_is_at_an_edge_is_extended_before_the_trunk_runs():
    s = study(methods=["constant", "wsd"])

    def constant_run(ema):
        run = history((1.0, 1.0))
        run[-1].losses[0.04] = ema
        return run

    finished = {f"constant-lr{lr:g}": constant_run(1.0 - lr) for lr in (0.05, 0.1, 0.2)}
    assert s.trunk_lr(finished) is None
    assert sorted(s.pending(finished, no_checkpoints)) == ["constant-lr0.4"]
    finished["constant-lr0.4"] = constant_run(0.85)
    assert s.trunk_lr(finished) == 0.2  # 0.4 is worse: 0.2 is interior


def test_a_transfer_launched_before_the_tuned_rule_keeps_its_trunk_at_the_recipes_lr():
    """A study resumed from a `launch.json` without `constant_lr` plans the runs it planned:
    the trunk at the recipe's LR from the start, every WSD branch off it."""
    s = study(methods=["constant", "wsd"], constant_lr="recipe")
    first = s.pending({}, no_checkpoints)
    assert sorted(first) == ["constant"]
    assert first["constant"]["optimizer"]["lr"] == 0.1 and first["constant"]["branch_from"] is None
    assert {0.9, 1.8, 3.6, 0.8, 1.6, 3.2} <= set(first["constant"]["budget"]["eval_at"])
    finished = {"constant": history((1.0, 1.0), (2.0, 0.9), (4.0, 0.8))}
    runs = s.pending(finished, lambda run, m: Path(f"/ckpt/{run}/{m:g}"))
    assert sorted(runs) == [f"{p}-{h}x" for p in ("wsd", "wsd-sqrt") for h in (1, 2, 4)]
    assert runs["wsd-1x"]["branch_from"] == "/ckpt/constant/0.9"
    with pytest.raises(ConfigError, match="constant_lr: expected one of tuned, recipe"):
        study(constant_lr="best")


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
    for name in ("constant-lr0.0316228", "cosine-1x-lr0.0316228", "linear-1x-lr0.0632456"):
        optimizer = first[name]["optimizer"]
        assert optimizer["name"] == "adamw" and tuple(optimizer["betas"]) == (0.9, 0.95)
        assert first[name]["schedule"]["warmup"] == 0.2  # the recipe's warmup
    assert math.isclose(first["constant-lr0.0316228"]["optimizer"]["lr"], adamw_lr, rel_tol=1e-5)


def test_the_constant_row_is_its_grids_winner_then_the_winners_continuation():
    s = study(methods=["constant"])
    runs = {}
    for lr, ema in ((0.05, 0.98), (0.1, 0.95), (0.2, 0.99)):
        runs[f"constant-lr{lr:g}"] = history((0.5, 1.2), (1.0, 1.1))
        runs[f"constant-lr{lr:g}"][-1].losses[0.04] = ema
    runs["constant"] = history((2.0, 0.9), (4.0, 0.8))
    runs["constant"][0].losses[0.04] = 0.85
    row = transfer_table(s, runs)["rows"]["constant + EMA (best of bank)"]
    assert row["loss"] == {"1": 0.95, "2": 0.85, "4": 0.8}
    assert row["compute"] == 3 * 1.0 + (4.0 - 1.0)  # the grid, then the continuation
    assert row["note"] == "LR 0.1 picked at 1x from 3 runs by the bank's best"


def test_a_constant_grid_that_diverged_everywhere_continues_nothing():
    """No LR of the grid gave a finite loss: there is no trunk to continue or branch off (a
    checkpoint of a diverged run is no start), and the study goes on without it."""
    s = study(methods=["constant", "wsd"])
    finished = {}
    while pending := s.pending(finished, no_checkpoints):
        finished |= {name: history((1.0, math.nan)) for name in pending}
    assert sorted(finished) == sorted(
        f"constant-lr{lr:g}" for lr in (0.0125, 0.025, 0.05, 0.1, 0.2)
    )
    assert s.trunk_lr(finished) is None


def test_the_constant_row_says_where_its_grid_hit_a_bound():
    s = study(methods=["constant"])
    runs = {}
    for lr in (0.05, 0.1, 0.2, 0.4, 0.8):  # better and better up to the bound, 0.8
        runs[f"constant-lr{lr:g}"] = history((1.0, 1.0 - lr / 4))
    runs["constant"] = history((2.0, 0.8), (4.0, 0.7))
    assert s.constant_grid().state(runs).bound_hit == "high"
    row = transfer_table(s, runs)["rows"]["constant + EMA (best of bank)"]
    assert row["note"].startswith("LR 0.8 picked at 1x from 5 runs by the bank's best, at the")
    assert "high bound" in row["note"]
