"""`recipe.lr_scheduler`: a real torch `LRScheduler` on the recipe's token clock, checked
against the recipe's own formula, torch's `LambdaLR` and the window's LR, through a save and
load mid-run."""

import dataclasses
import re
from pathlib import Path

import pytest
import torch
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from schedule_search.core.window import WindowAccumulator, WindowConfig
from schedule_search.recipe import Recipe, load_recipe

RECIPE = Path(__file__).parent.parent / "data" / "recipe_format1.yaml"  # warmup, then 1/t^0.5
TOKENS_PER_STEP = 512  # half a reference step: the warmup and the decay within 300 steps
STEPS = 300


def model_and_groups() -> tuple[torch.nn.Module, list[dict]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    recipe = load_recipe(RECIPE)
    groups = [
        {"params": model[0].parameters()},
        {"params": model[1].parameters(), "lr": recipe.peak_lr * 0.1},
    ]
    return model, groups


def train_steps(model, optimizer, scheduler, steps: int) -> list[list[float]]:
    """The LRs each optimizer step used, stepping as a trainer does."""
    used = []
    for k in range(steps):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(k))
        model(x).pow(2).mean().backward()
        used.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    return used


def test_the_lr_of_every_step_is_the_peak_times_the_multiplier_on_the_token_clock():
    recipe = load_recipe(RECIPE)
    model, groups = model_and_groups()
    optimizer = recipe.optimizer(groups)
    scheduler = recipe.lr_scheduler(optimizer, tokens_per_step=TOKENS_PER_STEP)
    assert isinstance(scheduler, LRScheduler)
    used = train_steps(model, optimizer, scheduler, STEPS)
    for k, lrs in enumerate(used):
        expected = recipe.peak_lr * recipe.lr_multiplier(recipe.clock(k * TOKENS_PER_STEP))
        assert lrs == pytest.approx([expected, 0.1 * expected], rel=1e-12), k
    multipliers = [lrs[0] / recipe.peak_lr for lrs in used]
    assert min(multipliers) < 0.2 and max(multipliers) == pytest.approx(1.0, abs=0.05)
    assert scheduler.get_last_lr() == [g["lr"] for g in optimizer.param_groups]

    # torch's own LambdaLR with the recipe's multiplier gives the same LRs.
    reference_model, reference_groups = model_and_groups()
    reference_optimizer = recipe.optimizer(reference_groups)
    reference = LambdaLR(
        reference_optimizer, lambda k: recipe.lr_multiplier(recipe.clock(k * TOKENS_PER_STEP))
    )
    reference_used = train_steps(reference_model, reference_optimizer, reference, STEPS)
    for ours, torchs in zip(used, reference_used, strict=True):
        assert ours == pytest.approx(torchs, rel=1e-12)
    for p, q in zip(model.parameters(), reference_model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_the_lr_is_the_one_the_recipes_window_steps_with_after_the_same_tokens():
    recipe = load_recipe(RECIPE)
    _, groups = model_and_groups()
    optimizer = recipe.optimizer(groups)
    scheduler = recipe.lr_scheduler(optimizer, tokens_per_step=TOKENS_PER_STEP)
    window_model, window_groups = model_and_groups()
    window_optimizer = recipe.optimizer(window_groups)
    window = WindowAccumulator(
        list(window_model.parameters()), window_optimizer, WindowConfig(clip_norm=None)
    )
    for _ in range(40):
        window.begin_microbatch(TOKENS_PER_STEP)
        window.backward(window_model(torch.ones(1, 4)).sum())
        lr = recipe.peak_lr * recipe.lr_multiplier(recipe.clock(window.tokens_seen))
        window.close(lr)
        assert [g["lr"] for g in optimizer.param_groups] == pytest.approx(
            [g["lr"] for g in window_optimizer.param_groups], rel=1e-12
        )
        optimizer.step()
        scheduler.step()


def test_a_save_and_load_mid_run_continues_the_same_lrs(tmp_path):
    recipe = load_recipe(RECIPE)
    model, groups = model_and_groups()
    optimizer = recipe.optimizer(groups)
    scheduler = recipe.lr_scheduler(optimizer, tokens_per_step=TOKENS_PER_STEP)
    unbroken = train_steps(model, optimizer, scheduler, STEPS)

    model, groups = model_and_groups()
    optimizer = recipe.optimizer(groups)
    scheduler = recipe.lr_scheduler(optimizer, tokens_per_step=TOKENS_PER_STEP)
    first = train_steps(model, optimizer, scheduler, 120)
    checkpoint = tmp_path / "checkpoint.pt"
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
        },
        checkpoint,
    )
    saved = torch.load(checkpoint, weights_only=True)  # numbers only: loads without pickle
    model, groups = model_and_groups()
    model.load_state_dict(saved["model"])
    fresh = load_recipe(RECIPE)  # a new process would load the recipe again
    optimizer = fresh.optimizer(groups)
    scheduler = fresh.lr_scheduler(optimizer, tokens_per_step=TOKENS_PER_STEP)
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    assert scheduler.tokens_seen == 120 * TOKENS_PER_STEP
    rest = train_steps(model, optimizer, scheduler, STEPS - 120)
    assert first + rest == unbroken


def test_a_bad_tokens_per_step_or_a_checkpoint_of_another_is_refused():
    recipe = load_recipe(RECIPE)
    _, groups = model_and_groups()
    optimizer = recipe.optimizer(groups)
    for bad in (0, -1, float("nan"), "512"):
        with pytest.raises(ValueError, match="tokens_per_step"):
            recipe.lr_scheduler(optimizer, tokens_per_step=bad)
    saved = recipe.lr_scheduler(optimizer, tokens_per_step=1024).state_dict()
    other = recipe.lr_scheduler(optimizer, tokens_per_step=512)
    with pytest.raises(ValueError, match=r"saved with 1024\.0"):
        other.load_state_dict(saved)
    # A recipe whose peak LR was edited since: neither LR wins in silence.
    optimizer_spec = dataclasses.replace(recipe.spec.optimizer, lr=2 * recipe.peak_lr)
    edited = Recipe(dataclasses.replace(recipe.spec, optimizer=optimizer_spec))
    resumed = edited.lr_scheduler(edited.optimizer(groups), tokens_per_step=1024)
    with pytest.raises(
        ValueError, match=re.escape(f"peak_lr: this scheduler has {2 * recipe.peak_lr!r}")
    ):
        resumed.load_state_dict(saved)
