"""The README's recipe example runs as written, against a real recipe file."""

import re
from pathlib import Path

import torch

from schedule_search.recipe import RECIPE_FORMAT, RecipeSpec, load_recipe, write_recipe
from schedule_search.train import TrainConfig

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> str:
    text = README.read_text()
    match = re.search(r"<!-- recipe-example -->\s*```python\n(.*?)```", text, re.S)
    assert match, "README lost its recipe example"
    return match.group(1)


def test_readme_recipe_example_runs(tmp_path, monkeypatch, capsys):
    config = TrainConfig()
    config.window.microbatches = 4
    spec = RecipeSpec(
        format=RECIPE_FORMAT,
        optimizer=config.optimizer,
        schedule=config.schedule,
        ema=config.ema,
        window=config.window,
        n_params=16_384,
        tokens_per_param=20.0,
        tokens_per_reference_step=256.0,
    )
    write_recipe(tmp_path / "recipe.yaml", spec)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(readme_example(), "README.md", "exec"), namespace)
    assert "loss with EMA weights:" in capsys.readouterr().out
    window, recipe = namespace["window"], namespace["recipe"]
    assert window.windows == 50 and window.tokens_seen == 200 * 256
    assert namespace["record"].lr == recipe.peak_lr * recipe.lr_multiplier(
        recipe.clock(49 * 4 * 256)
    )


def test_recipe_rescales_to_another_model_size(tmp_path):
    config = TrainConfig()
    spec = RecipeSpec(
        format=RECIPE_FORMAT,
        optimizer=config.optimizer,
        schedule=config.schedule,
        ema=config.ema,
        window=config.window,
        n_params=1000,
        tokens_per_param=20.0,
        tokens_per_reference_step=100.0,
    )
    write_recipe(tmp_path / "r.yaml", spec)
    small, large = load_recipe(tmp_path / "r.yaml"), load_recipe(tmp_path / "r.yaml", n_params=4000)
    # The same fraction of 1x Chinchilla gets the same multiplier at either size.
    for fraction in (0.01, 0.05, 0.5, 3.0):
        assert small.lr_multiplier(small.clock(fraction * 20_000)) == large.lr_multiplier(
            large.clock(fraction * 80_000)
        )


def test_window_needs_the_recipe_optimizer_first(tmp_path):
    config = TrainConfig()
    spec = RecipeSpec(
        format=RECIPE_FORMAT,
        optimizer=config.optimizer,
        schedule=config.schedule,
        ema=config.ema,
        window=config.window,
        n_params=10,
        tokens_per_param=20.0,
        tokens_per_reference_step=1.0,
    )
    write_recipe(tmp_path / "r.yaml", spec)
    recipe = load_recipe(tmp_path / "r.yaml")
    model = torch.nn.Linear(2, 2)
    try:
        recipe.window(model)
    except ValueError as err:
        assert "recipe.optimizer" in str(err)
    else:
        raise AssertionError("expected a clear error")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert recipe.window(model, optimizer).optimizer is optimizer
