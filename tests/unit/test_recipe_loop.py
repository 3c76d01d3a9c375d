"""The recipe in a user's own loop: param groups with their own LR, frozen parameters, bf16
weights, BatchNorm buffers (a rank that sits a micro-batch out, on real gloo ranks:
tests/integration/core/test_window_ranks.py)."""

import pytest
import torch
from helpers import recipe_file

from schedule_search.core.averaging import EmaBank, ema_decay
from schedule_search.core.window import WindowAccumulator, WindowConfig
from schedule_search.recipe import load_recipe

UNCLIPPED = WindowConfig(clip_norm=None)


def one_window(window: WindowAccumulator, model: torch.nn.Module, lr: float) -> None:
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(window.windows))
    window.begin_microbatch(8)
    window.backward(model(x).pow(2).sum())
    window.close(lr)


def test_each_param_group_keeps_its_ratio_to_the_default_lr_through_a_resume():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    groups = [
        {"params": model[0].parameters()},
        {"params": model[1].parameters(), "lr": 0.01},  # 0.1x the default
    ]
    optimizer = torch.optim.SGD(groups, lr=0.1)
    window = WindowAccumulator(list(model.parameters()), optimizer, UNCLIPPED)
    before = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    expected_grads = torch.autograd.grad(model(x).pow(2).sum() / 8, list(model.parameters()))
    one_window(window, model, lr=0.5)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.5, 0.05], rel=1e-15)
    lrs = [0.5, 0.5, 0.05, 0.05]  # plain SGD: each parameter moved by its group's lr x grad
    for p, p0, g, lr in zip(model.parameters(), before, expected_grads, lrs, strict=True):
        torch.testing.assert_close(p.detach(), p0 - lr * g, rtol=0, atol=1e-7)

    # A resumed optimizer (its groups saved at the scheduled LR) keeps the same ratios.
    rebuilt = torch.optim.SGD(
        [{"params": model[0].parameters()}, {"params": model[1].parameters(), "lr": 0.01}],
        lr=0.1,
    )
    rebuilt.load_state_dict(optimizer.state_dict())
    resumed = WindowAccumulator(list(model.parameters()), rebuilt, UNCLIPPED)
    one_window(resumed, model, lr=0.2)
    assert [g["lr"] for g in rebuilt.param_groups] == pytest.approx([0.2, 0.02], rel=1e-15)


def test_frozen_parameters_are_left_out_of_the_window_and_the_emas(tmp_path):
    recipe = load_recipe(recipe_file(tmp_path / "r.yaml", 100, 8.0))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    model[0].requires_grad_(False)
    frozen = [p.detach().clone() for p in model[0].parameters()]
    for params in (  # the optimizer may hold only what trains, or everything
        [p for p in model.parameters() if p.requires_grad],
        list(model.parameters()),
    ):
        optimizer = recipe.optimizer(params)
        window = recipe.window(model)
        assert window.optimizer is optimizer
        ema = recipe.ema(model)
        assert len(ema.params) == 2 and all(p.requires_grad for p in ema.params)
        for _ in range(3):
            one_window(window, model, lr=recipe.peak_lr)
            ema.update(recipe.clock(window.tokens_seen))
        assert all(torch.equal(p, f) for p, f in zip(model[0].parameters(), frozen, strict=True))
        assert all(p.grad is not None for p in model[1].parameters())


def drive(model: torch.nn.Module, bank: EmaBank, steps: int, seed: int) -> list[list[float]]:
    """Move the weights by small random steps; return each step's weights (float64 lists)."""
    generator = torch.Generator().manual_seed(seed)
    seen = []
    for step in range(1, steps + 1):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=generator) * 1e-3)
        bank.update(float(step))
        seen.append([p.detach().double().clone() for p in model.parameters()])
    return seen


def max_gap(mine: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    return max(float((a.double() - r).abs().max()) for a, r in zip(mine, reference, strict=True))


def test_the_ema_of_bf16_weights_is_kept_in_float32():
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16).to(torch.bfloat16)
    start = [p.detach().double().clone() for p in model.parameters()]
    bank = EmaBank.of(model, [0.0, 0.16])
    assert all(a.dtype == torch.float32 for a in bank.weights(0.16))
    seen = drive(model, bank, 2000, seed=1)
    # The reference: the same rule in float64 over the bf16 weights the bank saw.
    reference = start
    for step, weights in enumerate(seen, start=1):
        tau = ema_decay(step - 1, step, 0.16)
        reference = [tau * r + (1 - tau) * w for r, w in zip(reference, weights, strict=True)]
    gap = max_gap(bank.weights(0.16), reference)
    assert gap < 1e-5, gap
    # What a bf16 average would have drifted to on the same weights: far from the reference.
    lowp = [s.to(torch.bfloat16) for s in start]
    for step, weights in enumerate(seen, start=1):
        tau = ema_decay(step - 1, step, 0.16)
        lowp = [
            torch.lerp(a, w.to(torch.bfloat16), 1 - tau) for a, w in zip(lowp, weights, strict=True)
        ]
    drift = max_gap(lowp, reference)
    assert drift > 100 * gap, (drift, gap)
    with bank.swapped_in(0.16):  # evaluation sees the average, rounded to the weights' dtype
        assert model.weight.dtype == torch.bfloat16
        assert torch.equal(model.weight, bank.weights(0.16)[0].to(torch.bfloat16))


def test_batchnorm_statistics_are_averaged_with_the_weights():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    bank = EmaBank.of(model, [0.5])
    norm = model[1]
    assert any(t is norm.running_mean for t in bank.params)
    assert not any(t is norm.num_batches_tracked for t in bank.params)
    reference = norm.running_mean.detach().double().clone()
    for step in range(1, 6):
        model(torch.randn(16, 4) + step)  # training mode: the running statistics move
        bank.update(float(step))
        tau = ema_decay(step - 1, step, 0.5)
        reference = tau * reference + (1 - tau) * norm.running_mean.double()
    raw_mean, raw_count = norm.running_mean.clone(), norm.num_batches_tracked.clone()
    with bank.swapped_in(0.5):
        torch.testing.assert_close(norm.running_mean.double(), reference, rtol=0, atol=1e-6)
        assert not torch.equal(norm.running_mean, raw_mean)
        assert torch.equal(norm.num_batches_tracked, raw_count)
    assert torch.equal(norm.running_mean, raw_mean)
