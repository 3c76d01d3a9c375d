"""Choosing what to export, and bad recipe files."""

import pytest
import yaml

from schedule_search.config import ConfigError
from schedule_search.experiment import TrialRow, pareto_front, select_best
from schedule_search.recipe import load_recipe


def row(trial_id: str, loss: float, seconds: float) -> TrialRow:
    return TrialRow(trial_id, "completed", chinchilla=4.0, val_loss=loss, wall_s=seconds)


ROWS = [
    row("slow-best", 1.00, 300),
    row("mid", 1.02, 150),
    row("fast", 1.10, 100),
    row("bad", 1.20, 200),
]


def test_single_objective_picks_the_lowest_loss():
    assert select_best(ROWS).trial_id == "slow-best"


@pytest.mark.parametrize("slowdown, expected", [(1.0, "fast"), (1.6, "mid"), (3.0, "slow-best")])
def test_max_slowdown_picks_from_the_pareto_front(slowdown, expected):
    chosen = select_best(ROWS, slowdown)
    assert chosen.trial_id == expected
    assert chosen in pareto_front(ROWS)


def test_pareto_front():
    assert {r.trial_id for r in pareto_front(ROWS)} == {"slow-best", "mid", "fast"}
    assert select_best([]) is None


GOOD_RECIPE = {
    "format": 1,
    "optimizer": {"name": "adamw", "lr": 0.003},
    "schedule": {"kind": "poly", "gamma": 0.5, "alpha": 0.05, "warmup": 0.05},
    "ema": {"fractions": [0.0, 0.04], "objective": 0.04},
    "window": {"policy": "microbatches", "microbatches": 2},
    "n_params": 1000,
    "tokens_per_param": 20.0,
    "tokens_per_reference_step": 100.0,
}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"format": 2}, "format"),
        ({"n_params": 0}, "n_params"),
        ({"schedule": {"kind": "cosine"}}, "schedule.horizon: required"),
        ({"window": {"policy": "days"}}, "window.policy"),
        ({"optimizer": {"lr": "high"}}, "optimizer.lr"),
        ({"extra": 1}, "extra: unknown key"),
        ({"n_params": None}, "n_params"),
    ],
)
def test_bad_recipe_is_one_line(tmp_path, change, message):
    recipe = {**GOOD_RECIPE, **change}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    with pytest.raises(ConfigError, match=message) as err:
        load_recipe(path)
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_missing_and_garbled_recipe_files(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_recipe(tmp_path / "none.yaml")
    garbled = tmp_path / "g.yaml"
    garbled.write_bytes(b"\xff\xfe\x00garbage: [")
    with pytest.raises(ConfigError):
        load_recipe(garbled)
    without = dict(GOOD_RECIPE)
    del without["window"]
    (tmp_path / "w.yaml").write_text(yaml.safe_dump(without))
    with pytest.raises(ConfigError, match="window: required key is missing"):
        load_recipe(tmp_path / "w.yaml")
