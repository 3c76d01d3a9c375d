"""Windowed accumulation on one rank: the gradient a window steps with is the big-batch
gradient of the mean token loss, for every close policy (on two real gloo ranks:
tests/integration/core/test_window_ranks.py)."""

import pytest
import torch
from windows import (
    POLICIES,
    assert_same_gradient,
    make_batch,
    make_model,
    one_window,
    reference_gradient,
    token_sum_loss,
)

from schedule_search.core.window import WindowAccumulator, WindowConfig


def pure_noise_batch(model, tick: int, size: int):
    """Labels centred on the model's own output: the expected gradient is exactly zero."""
    g = torch.Generator().manual_seed(tick)
    x = torch.randn(size, 6, generator=g, dtype=torch.float64)
    with torch.no_grad():
        y = model(x) + torch.randn(size, 1, generator=g, dtype=torch.float64)
    return x, y


@pytest.mark.parametrize("policy", POLICIES)
def test_window_gradient_is_big_batch_gradient_one_rank(policy):
    out = one_window(0, 1, policy)
    assert len(out["xs"]) > 1, "the window should hold several micro-batches"
    assert len({len(x) for x in out["xs"]}) > 1, "micro-batch sizes should differ"
    assert_same_gradient(out["grads"], reference_gradient(make_model(), out["xs"], out["ys"]))
    assert out["record"].tokens == sum(len(x) for x in out["xs"])


def test_clipping_after_normalization_matches_torch():
    xs = [make_batch(0, t, 3 + t) for t in range(4)]
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    window = WindowAccumulator(
        list(model.parameters()), optimizer, WindowConfig(microbatches=4, clip_norm=0.05)
    )
    for i, (x, y) in enumerate(xs):
        last = window.begin_microbatch(len(x))
        window.backward(token_sum_loss(model, x, y))
        assert last == (i == 3)
    record = window.close(lr=0.5)

    reference = make_model()
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    grads = reference_gradient(reference, [x for x, _ in xs], [y for _, y in xs])
    total = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.05)
    ref_optimizer.step()
    assert record.grad_norm == pytest.approx(float(total), rel=1e-12)
    assert record.grad_norm > 0.05, "the test must actually clip"
    assert float(torch.linalg.norm(torch.cat([g.flatten() for g in grads]))) == pytest.approx(
        record.grad_norm, rel=1e-12
    )
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-14, rtol=0)


def test_gradients_are_zeroed_after_close_and_memory_graph_is_freed():
    model = make_model()
    window = WindowAccumulator(
        list(model.parameters()),
        torch.optim.SGD(model.parameters(), lr=0.1),
        WindowConfig(microbatches=2),
    )
    x, y = make_batch(0, 0, 5)
    for _ in range(2):
        window.begin_microbatch(5)
        loss = token_sum_loss(model, x, y)
        window.backward(loss)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()  # the graph was freed: no retain_graph
    window.close(lr=0.1)
    assert all(float(p.grad.abs().sum()) == 0 for p in model.parameters())


def test_replacing_grads_inside_a_window_is_an_error():
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    window = WindowAccumulator(list(model.parameters()), optimizer, WindowConfig(microbatches=2))
    window.begin_microbatch(3)
    window.backward(token_sum_loss(model, *make_batch(0, 0, 3)))
    optimizer.zero_grad()  # set_to_none=True drops the window's buffers
    window.begin_microbatch(3)
    window.backward(token_sum_loss(model, *make_batch(0, 1, 3)))
    with pytest.raises(RuntimeError, match="zero_grad"):
        window.close(lr=0.1)


def settled_length(snr: float, signal: bool, seed: int) -> int:
    """The length of the fourth window: each close sets the next window's length from the
    statistics it reduced (the first is `min_microbatches` long)."""
    model = make_model()
    window = WindowAccumulator(
        list(model.parameters()),
        torch.optim.SGD(model.parameters(), lr=0.0),
        WindowConfig(policy="grad_norm", snr=snr, max_microbatches=200),
    )
    lengths, ticks = [], 0
    for tick in range(1000):
        last = window.begin_microbatch(8)
        batch = (
            make_batch(seed, tick, 8) if signal else pure_noise_batch(model, 1000 * seed + tick, 8)
        )
        window.backward(token_sum_loss(model, *batch))
        ticks += 1
        if last:
            lengths.append(ticks)
            ticks = 0
            window.close(lr=0.0)
        if len(lengths) == 4:
            assert lengths[0] == 4 and all(n <= 200 for n in lengths)
            return lengths[-1]
    raise AssertionError("four windows must close")


def test_grad_norm_policy_follows_the_signal_to_noise_ratio():
    seeds = range(5)
    low = sorted(settled_length(2.0, True, s) for s in seeds)
    high = sorted(settled_length(32.0, True, s) for s in seeds)
    noise = sorted(settled_length(2.0, False, s) for s in seeds)
    # A higher threshold needs a longer window (SNR grows with the tokens in it) ...
    assert low[2] * 3 < high[2], (low, high)
    # ... and a gradient with no signal never reaches it: the cap closes those windows.
    assert noise[2] > 4 * low[2], (low, noise)
