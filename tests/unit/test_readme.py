"""The README's recipe example runs as written, against a real recipe file."""

import re

import pytest
import torch
from helpers import REPO, recipe_file

from schedule_search.recipe import load_recipe

README = REPO / "README.md"


def readme_example() -> str:
    text = README.read_text()
    match = re.search(r"<!-- recipe-example -->\s*```python\n(.*?)```", text, re.S)
    assert match, "README lost its recipe example"
    return match.group(1)


def test_readme_recipe_example_runs(tmp_path, monkeypatch, capsys):
    recipe_file(tmp_path / "recipe.yaml", 16_384, 256.0, microbatches=4)
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
    path = recipe_file(tmp_path / "r.yaml", 1000, 100.0)
    small, large = load_recipe(path), load_recipe(path, n_params=4000)
    # The same fraction of 1x Chinchilla gets the same multiplier at either size.
    for fraction in (0.01, 0.05, 0.5, 3.0):
        assert small.lr_multiplier(small.clock(fraction * 20_000)) == large.lr_multiplier(
            large.clock(fraction * 80_000)
        )


def test_window_needs_the_recipe_optimizer_first(tmp_path):
    recipe = load_recipe(recipe_file(tmp_path / "r.yaml", 10, 1.0))
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"recipe\.optimizer"):
        recipe.window(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert recipe.window(model, optimizer).optimizer is optimizer
    own = recipe.optimizer(model.parameters())
    assert recipe.window(model).optimizer is own


def test_readme_cli_reference_matches_help():
    """Every verb of the parser has a row in the README's command table, and every flag its
    `--help` lists is in that row (and no row names a flag the verb does not take)."""
    from schedule_search.cli import build_parser

    rows = {
        m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+) [^|]*\|", README.read_text(), re.M)
    }
    verbs = build_parser()._subparsers._group_actions[0].choices
    assert set(verbs) == set(rows), (sorted(verbs), sorted(rows))
    for verb, parser in verbs.items():
        flags = {
            option
            for action in parser._actions
            for option in action.option_strings
            if option.startswith("--") and option != "--help"
        }
        documented = set(re.findall(r"--[a-z][a-z-]*", rows[verb]))
        assert flags == documented, (verb, sorted(flags ^ documented))


def hf_example() -> str:
    match = re.search(r"<!-- hf-example -->\s*```python\n(.*?)```", README.read_text(), re.S)
    assert match, "README lost its Hugging Face Trainer example"
    return match.group(1)


def test_readme_hf_trainer_example_runs(tmp_path, monkeypatch):
    """The example trains a tiny Llama with the real Trainer, saves the EMA bank with its
    checkpoint, and saves the recipe's EMA weights (not the raw ones) as a model."""
    from schedule_search.integrations.hf import EMA_FILE

    recipe_file(tmp_path / "recipe.yaml", 16_384, 256.0, microbatches=2)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(hf_example(), "README.md", "exec"), namespace)
    trainer, callback = namespace["trainer"], namespace["callback"]
    assert trainer.state.global_step == 20 and trainer.args.gradient_accumulation_steps == 2
    assert (tmp_path / "hf-out" / "checkpoint-20" / EMA_FILE).is_file()
    assert callback.ema.t == callback.recipe.clock(20 * 8 * 32 * 2)
    from safetensors.torch import load_file

    saved = load_file(tmp_path / "hf-out" / "ema" / "model.safetensors")
    names = [name for name, _ in namespace["model"].named_parameters()]
    averages = dict(zip(names, callback.ema.weights(callback.recipe.ema_fraction), strict=False))
    assert set(saved) <= set(averages) and len(saved) == len(names)
    for name, tensor in saved.items():  # the EMA was saved, the raw weights came back after
        assert torch.equal(tensor, averages[name].to(tensor.dtype)), name
    raw = dict(namespace["model"].named_parameters())
    assert any(not torch.equal(saved[name], raw[name].detach()) for name in saved)


def test_the_readme_training_example_is_a_valid_config_of_the_papers_proportions():
    from schedule_search.core.schedules import ScheduleConfig
    from schedule_search.train.config import load_train_config

    config = load_train_config(REPO / "examples" / "train.yaml")
    # The paper's proportions, the defaults (an alpha of a few hundredths of 1x would collapse
    # the 1/sqrt decay by 1x: not the paper's schedule).
    paper = ScheduleConfig()
    assert (config.schedule.kind, config.schedule.gamma) == ("poly", 0.5)
    assert (config.schedule.warmup, config.schedule.alpha) == (paper.warmup, paper.alpha)
    assert config.budget.horizon > config.schedule.warmup
