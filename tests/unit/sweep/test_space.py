"""Search spaces are validated completely before anything starts: a table of malformed spaces
and sweep flags, each one line on stderr, exit code 2, no experiment folder, no Ray."""

import copy
import json
import math

import pytest
import yaml

from schedule_search.cli import main
from schedule_search.sweep.space import load_space, trial_config, uses_asha

GOOD = {
    "name": "ok",
    "samples": 2,
    "base": {"task": {"name": "linreg", "dim": 16}, "budget": {"horizon": 2.0, "eval_at": [1.0]}},
    "params": {
        "optimizer.lr": {"type": "loguniform", "low": 0.001, "high": 0.1},
        "ema.objective": {"type": "loguniform", "low": 0.01, "high": 0.2},
    },
}


def variant(path: str, value, remove: bool = False):
    space = copy.deepcopy(GOOD)
    *parents, last = path.split("/")
    node = space
    for part in parents:
        node = node.setdefault(part, {})
    if remove:
        del node[last]
    else:
        node[last] = value
    return space


MALFORMED = [
    (variant("surprise", 1), "surprise: unknown key"),
    (variant("samples", 0), "samples"),
    (variant("samples", "many"), "samples"),
    (variant("startup_trials", 0), "startup_trials"),
    (variant("scheduler", "hyperband"), "scheduler"),
    (variant("first_rung", 0.5), "first_rung: 0.5 is not a milestone below the horizon; expected"),
    (variant("first_rung", 2.0), "first_rung: 2 is not a milestone below the horizon"),
    (variant("first_rung", 0), "first_rung"),
    (variant("params/optimizer.lr/type", "normal"), "params.optimizer.lr.type"),
    (variant("params/optimizer.lr/low", 0.5), "params.optimizer.lr.high: must exceed low"),
    (variant("params/optimizer.lr/low", -1.0), "log scale needs low > 0"),
    (variant("params/optimizer.lr/high", None, remove=True), "needs both low and high"),
    (
        variant("params/window.microbatches", {"type": "int", "low": 0, "high": 4}),
        "window.microbatches",
    ),
    (
        variant("params/window.microbatches", {"type": "int", "low": 1.5, "high": 4}),
        "whole numbers",
    ),
    (variant("params/schedule.kind", {"type": "choice", "values": []}), "non-empty list"),
    (
        variant("params/schedule.kind", {"type": "choice", "values": ["poly", "linear"]}),
        "schedule.kind",
    ),
    (
        variant("params/optimiser.lr", {"type": "uniform", "low": 0.1, "high": 0.2}),
        "not a training config key",
    ),
    (
        variant("params/schedule.gamma", {"type": "uniform", "low": 0.0, "high": 5.0}),
        "schedule.gamma",
    ),
    (variant("base/task", {"name": "linreg", "dimm": 3}), "task.dimm: unknown key"),
    (
        variant("base/schedule", {"kind": "cosine", "horizon": 2.0}) | {"scheduler": "asha"},
        "scheduler: asha",
    ),
    (
        variant("base/schedule", {"kind": "cosine", "horizon": 4.0}),
        "schedule.horizon: 4 is not budget.horizon 2; a cosine trial is scored at the end of its "
        "own schedule",
    ),
    (
        variant("base/schedule", {"kind": "wsd", "horizon": 2.0})
        | {"params": {"schedule.horizon": {"type": "uniform", "low": 1.0, "high": 2.0}}},
        "schedule.horizon: 1 is not budget.horizon 2; a wsd trial is scored at the end of its "
        "own schedule (set both, or pass --horizon, which sets both) (from "
        "params.schedule.horizon = 1.0)",
    ),
    (variant("points_to_evaluate", [{"optimizer.momentum": 0.5}]), "not a searched param"),
    (
        variant("points_to_evaluate", [{"optimizer.lr": -3, "ema.objective": 0.1}]),
        "points_to_evaluate[0].optimizer.lr: expected a number in [0.001, 0.1], got -3",
    ),
    (
        variant("points_to_evaluate", [{"optimizer.lr": 0.5, "ema.objective": 0.1}]),
        "points_to_evaluate[0].optimizer.lr: expected a number in [0.001, 0.1], got 0.5",
    ),
    (  # the form the space docstring once showed: Ray crashed after the folder was written
        variant("points_to_evaluate", [{"optimizer.lr": 0.01}]),
        "points_to_evaluate[0]: ema.objective is missing",
    ),
    (variant("params/optimizer.lr/high", float("inf")), "params.optimizer.lr.high: Input should"),
    (variant("params/optimizer.lr/low", float("nan")), "params.optimizer.lr.low: Input should"),
    (variant("params", {}), "params: nothing to search"),
    (
        variant("params/budget.horizon", {"type": "uniform", "low": 1.0, "high": 2.0}),
        "params.budget.horizon: not searchable",
    ),
    (
        variant("params/checkpoint.keep", {"type": "int", "low": 1, "high": 3}),
        "params.checkpoint.keep: not searchable",
    ),
    (
        variant("params/window.microbatches", {"type": "int", "low": 1, "high": 10**12}),
        "window.microbatches: 1000000000000 exceeds max_microbatches (1024)",
    ),
    (variant("name", "../escape"), "name: expected letters, digits"),
    (variant("name", "/tmp/elsewhere"), "name: expected letters, digits"),
    (variant("name", ".hidden"), "name: expected letters, digits"),
    ([1, 2], "expected a mapping"),
]


@pytest.mark.parametrize("space, message", MALFORMED)
def test_malformed_space_is_refused_before_anything_starts(tmp_path, capsys, space, message):
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    storage = tmp_path / "runs"
    assert main(["sweep", str(path), "--storage", str(storage)]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert str(path) in err and err.count("\n") == 1
    assert not storage.exists(), "nothing may be written or launched"


BAD_FLAGS = [
    (["--samples", "0"], "--samples"),
    (["--samples", "x"], "--samples"),
    (["--workers", "-2"], "--workers"),
    (["--concurrency", "0"], "--concurrency"),
    (["--horizon", "0"], "--horizon"),
    (["--horizon", "nan"], "--horizon"),
    (["--horizon", "inf"], "--horizon"),
    (["--gpus-per-worker", "-1"], "--gpus-per-worker"),
    (["--seed", "one"], "--seed"),
    (["--name", "../escape"], "--name"),
    (["--name", ""], "--name"),
    (["--bogus"], "unrecognized arguments"),
]


@pytest.mark.parametrize(
    "space",
    [
        variant("base/sharding", "fsdp"),
        variant("params/sharding", {"type": "choice", "values": ["replicated", "fsdp"]}),
    ],
)
def test_a_sharded_space_needs_two_workers(tmp_path, capsys, space):
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    storage = tmp_path / "runs"
    assert main(["sweep", str(path), "--storage", str(storage), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{path}: sharding: fsdp shards across" in err and err.count("\n") == 1, err
    assert not storage.exists()


def test_a_sharded_space_is_refused_before_its_cluster_is_asked_anything(tmp_path, capsys):
    """The refusal needs no cluster: a cluster address where nothing listens is never tried
    (connecting first cost a user Ray's connection retries before the one line)."""
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(variant("base/sharding", "fsdp")))
    flags = ["--storage", str(tmp_path / "runs"), "--workers", "1", "--address", "127.0.0.1:9"]
    assert main(["sweep", str(path), *flags]) == 2
    err = capsys.readouterr().err
    assert f"{path}: sharding: fsdp shards across" in err and err.count("\n") == 1, err


def test_a_combination_of_searched_keys_that_cannot_run_is_refused_before_launch(tmp_path, capsys):
    space = variant("params/sharding", {"type": "choice", "values": ["replicated", "fsdp"]})
    space["params"]["window.policy"] = {"type": "choice", "values": ["microbatches", "grad_norm"]}
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    storage = tmp_path / "runs"
    assert main(["sweep", str(path), "--storage", str(storage), "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert "grad_norm does not run sharded" in err and "with params." in err, err
    assert err.count("\n") == 1 and not storage.exists()


@pytest.mark.parametrize("flags, message", BAD_FLAGS)
def test_bad_sweep_flags(tmp_path, capsys, flags, message):
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    storage = tmp_path / "runs"
    assert main(["sweep", str(path), "--storage", str(storage), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not storage.exists()


HORIZON_AWARE_SPACES = {
    "cosine in the base": variant("base/schedule", {"kind": "cosine", "horizon": 2.0}),
    "a searched kind": variant("base/schedule", {"kind": "poly", "horizon": 2.0})
    | {"params": {"schedule.kind": {"type": "choice", "values": ["poly", "cosine"]}}},
    "a family's wsd": GOOD
    | {
        "families": {
            "w": {
                "base": {"schedule": {"kind": "wsd", "horizon": 2.0}},
                "params": {"optimizer.momentum": {"type": "uniform", "low": 0.0, "high": 0.5}},
            },
            "p": {"params": {"schedule.gamma": {"type": "uniform", "low": 0.0, "high": 1.0}}},
        }
    },
}


@pytest.mark.parametrize("space", HORIZON_AWARE_SPACES.values(), ids=HORIZON_AWARE_SPACES)
def test_horizon_flag_moves_the_end_of_a_horizon_aware_schedule_with_the_budget(
    tmp_path, capsys, space
):
    """`--horizon 3` on a space whose cosine or WSD trials end at its 2x budget sets both: the
    space passes the check that refuses a schedule scored away from its end (without the flag,
    below) and the sweep stops only at the existing experiment, before anything launches."""
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    storage = tmp_path / "runs"
    (storage / "ok").mkdir(parents=True)
    (storage / "ok" / "sweep.json").write_text("{}")
    assert main(["sweep", str(path), "--storage", str(storage), "--horizon", "3"]) == 2
    err = capsys.readouterr().err
    assert "experiment exists" in err and "schedule.horizon" not in err, err
    assert yaml.safe_load(path.read_text()) == space, "the user's file is not rewritten"


def test_a_family_scored_away_from_its_end_is_named_and_a_stored_space_still_reads(
    tmp_path, capsys
):
    space = json.loads(json.dumps(HORIZON_AWARE_SPACES["a family's wsd"]))
    space["families"]["w"]["base"]["schedule"]["horizon"] = 4.0
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    assert main(["sweep", str(path), "--storage", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "schedule.horizon: 4 is not budget.horizon 2; a wsd trial" in err and err.endswith(
        "(in family w)\n"
    ), err
    # A new sweep's check only: an experiment's own copy (status, export, report, resume of a
    # sweep launched before the check existed) still reads.
    assert load_space(path).families.keys() == {"w", "p"}


def test_missing_space_file(tmp_path, capsys):
    assert main(["sweep", str(tmp_path / "none.yaml")]) == 2
    assert "file not found" in capsys.readouterr().err


@pytest.mark.parametrize("verb", ["resume", "status", "export"])
def test_verbs_on_a_missing_experiment(tmp_path, capsys, verb):
    assert main([verb, "nothing", "--storage", str(tmp_path)]) == 2
    assert "no sweep here" in capsys.readouterr().err


def test_existing_experiment_is_not_overwritten(tmp_path, capsys):
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    folder = tmp_path / "runs" / "ok"
    folder.mkdir(parents=True)
    (folder / "sweep.json").write_text(json.dumps({"name": "ok"}))
    assert main(["sweep", str(path), "--storage", str(tmp_path / "runs")]) == 2
    assert "resume ok" in capsys.readouterr().err


def test_horizon_override_and_shipped_spaces(tmp_path):
    for name in ("default", "linreg", "cosine", "wsd"):
        space = load_space(f"search_spaces/{name}.yaml")
        assert uses_asha(space) == (name in ("default", "linreg"))
    space = load_space("search_spaces/default.yaml")
    config = trial_config(space, {"ema.objective": 0.123})
    assert 0.123 in config.ema.fractions and config.ema.objective == 0.123


PAPER_ALPHA = 51_200 / 12_500  # the paper's selected offset over its 1x Chinchilla steps
PAPER_WARMUP = 5_000 / 12_500


#: The shipped spaces of the anytime schedules, and the family that holds them (None: the
#: space searches that family alone).
ANYTIME = {"default": "anytime", "linreg": None}


def anytime_params(space, family):
    return space.families[family].params if family else space.params


@pytest.mark.parametrize(("name", "family"), ANYTIME.items())
def test_shipped_anytime_spaces_search_alpha_around_the_papers(name, family):
    """alpha on a log scale over a range holding the paper's ~4x with a decade either side,
    gamma over [0, 1], LR on a log scale, and the EMA fraction through the bank (no trials)."""
    space = load_space(f"search_spaces/{name}.yaml")
    params = anytime_params(space, family)
    alpha = params["schedule.alpha"]
    assert alpha.type == "loguniform"
    assert alpha.low <= PAPER_ALPHA / 10 and alpha.high >= PAPER_ALPHA * 9.5
    gamma = params["schedule.gamma"]
    assert (gamma.low, gamma.high) == (0.0, 1.0)
    assert params["optimizer.lr"].type == "loguniform"
    assert "ema.objective" not in space.params and "ema.objective" not in params
    base = trial_config(space, {"family": family} if family else {})
    assert base.ema.objective == "best" and len([f for f in base.ema.fractions if f > 0]) >= 6
    for point in space.points_to_evaluate:
        trial_config(space, point)


@pytest.mark.parametrize("name", ["default", "cosine", "wsd"])
def test_shipped_tinylm_spaces_warm_up_in_the_papers_proportion(name):
    family = {"family": "anytime"} if name == "default" else {}
    base = trial_config(load_space(f"search_spaces/{name}.yaml"), family)
    assert base.schedule.warmup == pytest.approx(PAPER_WARMUP)


def test_the_default_space_searches_schedule_free_where_its_readme_says_to():
    """Schedule-free AdamW's README: an LR 1x-10x the schedule-based one (the anytime family's
    range here), warmup recommended, beta 0.9 (raised only for very long runs, which a sweep
    scored at 4x does not see: fixed, not searched); both families start from the point their
    sources advise."""
    space = load_space("search_spaces/default.yaml")
    free, anytime = space.families["schedulefree"], space.families["anytime"]
    lr, anytime_lr = free.params["optimizer.lr"], anytime.params["optimizer.lr"]
    assert lr.type == "loguniform" and lr.low <= 7.9e-3 and lr.high >= 10 * 7.9e-3
    assert anytime_lr.low <= lr.low and lr.high <= 10 * anytime_lr.high
    warmup = free.params["schedule.warmup"]
    assert warmup.low <= PAPER_WARMUP / 2 and warmup.high >= 2 * PAPER_WARMUP
    assert "optimizer.betas.0" not in free.params
    config = trial_config(space, {"family": "schedulefree"})
    assert config.optimizer.name == "schedulefree_adamw" and config.schedule.kind == "constant"
    assert config.optimizer.betas[0] == 0.9
    points = {p["family"]: p for p in space.points_to_evaluate}
    assert points["schedulefree"]["schedulefree:optimizer.lr"] == pytest.approx(
        math.sqrt(10) * points["anytime"]["anytime:optimizer.lr"], rel=0.01
    )


def test_schedule_defaults_are_the_papers_proportions():
    from schedule_search.core.schedules import ScheduleConfig

    config = ScheduleConfig()
    assert config.alpha == pytest.approx(round(PAPER_ALPHA))
    assert config.warmup == pytest.approx(PAPER_WARMUP)
    # The paper's 1/sqrt keeps 0.73 of the peak LR at 4x and 0.34 at 32x (t in multiples).
    schedule = config.build(steps_per_chinchilla=1.0)
    assert schedule(4.0) == pytest.approx(0.7255, abs=1e-4)
    assert schedule(32.0) == pytest.approx(0.3352, abs=1e-4)


def test_a_space_names_its_sampler(tmp_path, capsys):
    path = tmp_path / "space.yaml"
    for sampler in ("tpe", "gp", "random"):
        path.write_text(yaml.safe_dump({**GOOD, "sampler": sampler}))
        assert load_space(path).sampler == sampler
    path.write_text(yaml.safe_dump({**GOOD, "sampler": "cmaes"}))
    assert main(["sweep", str(path), "--storage", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "sampler" in err and err.count("\n") == 1


def test_a_trial_that_cannot_fit_and_a_tiny_corpus_are_named_before_anything_is_written(
    tmp_path, capsys
):
    import os

    data = tmp_path / "tiny.txt"
    data.write_text("def f(x):\n    return x + 1\n" * 35)  # ~1 KB: under one micro-batch
    space = {**GOOD, "base": {**GOOD["base"], "task": {"name": "tinylm", "data": str(data)}}}
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    storage = tmp_path / "runs"
    workers = str((os.cpu_count() or 1) + 1)
    assert main(["sweep", str(path), "--workers", workers, "--storage", str(storage)]) == 2
    warning, error = capsys.readouterr().err.splitlines()
    assert warning.startswith(f"warning: {path}: task.data: ") and "fewer than 4 micro" in warning
    assert error == (
        f"error: --workers: a trial of {workers} workers x 1 CPU needs {workers} CPUs; "
        f"this machine has {os.cpu_count()}"
    )
    assert not storage.exists()
    gpus = ["--workers", "1", "--gpus-per-worker", "1000"]
    assert main(["sweep", str(path), *gpus, "--storage", str(storage)]) == 2
    assert "--gpus-per-worker: a trial of 1 workers x 1000 GPU" in capsys.readouterr().err
    assert not storage.exists()
