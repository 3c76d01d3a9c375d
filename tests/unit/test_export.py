"""Choosing what to export, and bad recipe files."""

import pytest
import torch
import yaml
from helpers import DATA, GOOD_RECIPE

from schedule_search.core.config import ConfigError
from schedule_search.recipe import load_recipe
from schedule_search.store.experiment import TrialRow, select_best


def row(trial_id: str, loss: float, seconds: float) -> TrialRow:
    return TrialRow(trial_id, "completed", chinchilla=4.0, val_loss=loss, wall_s=seconds)


def pareto_front(rows: list[TrialRow]) -> list[TrialRow]:
    """Trials no other trial beats on both loss and wall-clock time: the reference that
    `select_best` with a `max_slowdown` must pick from (the package's own copy, used by
    nothing but these tests, went in the restructuring)."""
    return [
        r
        for r in rows
        if not any(
            o.val_loss <= r.val_loss
            and o.wall_s <= r.wall_s
            and (o.val_loss < r.val_loss or o.wall_s < r.wall_s)
            for o in rows
        )
    ]


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


def test_a_recipe_written_before_alpha_was_searched_still_loads_as_it_was():
    """tests/data/recipe_format1.yaml was exported by the code before the schedule defaults
    moved to the paper's proportions; it spells out its own alpha and warmup, so it loads
    and keeps them."""
    recipe = load_recipe(DATA / "recipe_format1.yaml")
    assert recipe.spec.schedule.alpha == 0.05 and recipe.spec.schedule.warmup == 0.05
    assert recipe.ema_fraction == 0.04
    steps = recipe.token_clock.steps_per_chinchilla
    t = 4.0 * steps  # 4x Chinchilla
    assert recipe.lr_multiplier(t) == pytest.approx((0.05 / (4.0 - 0.05 + 0.05)) ** 0.5)


def test_a_recipe_must_name_the_fraction_it_evaluates_with(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({**GOOD_RECIPE, "ema": {"fractions": [0.0, 0.04]}}))
    assert load_recipe(path).ema_fraction == 0.04  # the paper's headline, when unsaid
    path.write_text(
        yaml.safe_dump({**GOOD_RECIPE, "ema": {"fractions": [0.0, 0.04], "objective": "best"}})
    )
    with pytest.raises(ConfigError, match=r"ema\.objective: a recipe names the EMA fraction") as e:
        load_recipe(path)
    assert str(e.value).startswith(str(path)) and "\n" not in str(e.value)


def test_alpha_and_warmup_are_chinchilla_multiples_rescaled_by_n_params(tmp_path):
    path = tmp_path / "r.yaml"
    schedule = {"kind": "poly", "gamma": 0.5, "alpha": 4.0, "warmup": 0.4}
    path.write_text(yaml.safe_dump({**GOOD_RECIPE, "schedule": schedule}))
    small, large = load_recipe(path), load_recipe(path, n_params=8000)
    for recipe, n_params in ((small, 1000), (large, 8000)):
        steps_per_x = 20.0 * n_params / 100.0  # tokens_per_param x n_params / tokens per step
        assert recipe.schedule.alpha == pytest.approx(4.0 * steps_per_x)
        assert recipe.schedule.warmup.steps == pytest.approx(0.4 * steps_per_x)
        for multiple in (0.2, 1.0, 4.0, 32.0):
            t = multiple * steps_per_x
            expected = (
                0.1 + 0.9 * multiple / 0.4 if multiple < 0.4 else (4 / (multiple - 0.4 + 4)) ** 0.5
            )
            assert recipe.lr_multiplier(t) == pytest.approx(expected, abs=1e-12)


def test_a_recipe_file_without_a_family_loads_with_none():
    """Recipe files exported before sweeps searched families have no `family` key."""
    recipe = load_recipe(DATA / "recipe_format1.yaml")
    assert recipe.spec.family is None
    assert recipe.how_to_evaluate.startswith("evaluate with the EMA of fraction 0.04")


def test_a_schedule_free_recipe_says_how_to_evaluate_and_evaluates_at_its_average(tmp_path):
    """A schedule-free recipe builds schedule-free AdamW, writes its evaluation in one line
    at the top of the file, and `evaluation_weights` gives the model the optimizer's own
    averaged weights (schedulefree's `eval()`) then the EMA; the training point comes back
    bit for bit after."""
    from schedulefree import AdamWScheduleFree

    from schedule_search.recipe import RecipeSpec, write_recipe

    spec = load_recipe(DATA / "recipe_format1.yaml").spec
    path = tmp_path / "sf.yaml"
    spec.optimizer.name, spec.family = "schedulefree_adamw", "schedulefree"
    spec.ema.fractions, spec.ema.objective = [0.0], 0.0
    write_recipe(path, RecipeSpec(**vars(spec)))
    assert "optimizer.eval() before" in path.read_text().splitlines()[1]
    recipe = load_recipe(path)
    assert recipe.spec.family == "schedulefree"
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = recipe.optimizer(model.parameters())
    assert isinstance(optimizer, AdamWScheduleFree)
    ema = recipe.ema(model)
    for _ in range(5):
        model(torch.randn(8, 4)).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    training_point = [p.detach().clone() for p in model.parameters()]
    optimizer.eval()  # schedulefree's own switch: the reference
    averaged = [p.detach().clone() for p in model.parameters()]
    optimizer.train()
    assert not torch.equal(averaged[0], training_point[0])
    with recipe.evaluation_weights(optimizer, ema):
        for p, want in zip(model.parameters(), averaged, strict=True):
            torch.testing.assert_close(p.detach(), want, rtol=0, atol=1e-7)
    for p, want in zip(model.parameters(), training_point, strict=True):
        assert torch.equal(p.detach(), want)
