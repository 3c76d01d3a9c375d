"""Windowed accumulation: the gradient a window steps with is the big-batch gradient of the
mean token loss, on one rank and on two real gloo ranks, for every close policy."""

import math
import time

import pytest
import torch
from helpers import run_ranks

from schedule_search.window import WindowAccumulator, WindowConfig

POLICIES = {
    "microbatches": WindowConfig(policy="microbatches", microbatches=5, clip_norm=None),
    "tokens": WindowConfig(policy="tokens", tokens=40, clip_norm=None),
    "seconds": WindowConfig(policy="seconds", seconds=0.05, clip_norm=None),
    "grad_norm": WindowConfig(policy="grad_norm", snr=4.0, max_microbatches=40, clip_norm=None),
}


class RecordingOptimizer(torch.optim.Optimizer):
    """A real optimizer whose step records the gradients it is given and moves nothing."""

    def __init__(self, params):
        super().__init__(params, {"lr": 0.0})
        self.seen: list[list[torch.Tensor]] = []

    def step(self, closure=None):
        self.seen.append([p.grad.clone() for g in self.param_groups for p in g["params"]])


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(
        torch.float64
    )


def make_batch(rank: int, tick: int, size: int):
    g = torch.Generator().manual_seed(1000 * rank + tick)
    x = torch.randn(size, 6, generator=g, dtype=torch.float64)
    y = x.sum(dim=1, keepdim=True)
    return x, y + 0.1 * torch.randn(size, 1, generator=g, dtype=torch.float64)


def pure_noise_batch(model, tick: int, size: int):
    """Labels centred on the model's own output: the expected gradient is exactly zero."""
    g = torch.Generator().manual_seed(tick)
    x = torch.randn(size, 6, generator=g, dtype=torch.float64)
    with torch.no_grad():
        y = model(x) + torch.randn(size, 1, generator=g, dtype=torch.float64)
    return x, y


def token_sum_loss(model, x, y):
    return ((model(x) - y) ** 2).sum()


def reference_gradient(model, xs, ys):
    """Gradient of the mean token loss over all the window's data taken as one batch."""
    model.zero_grad(set_to_none=True)
    x, y = torch.cat(xs), torch.cat(ys)
    (token_sum_loss(model, x, y) / len(x)).backward()
    return [p.grad.clone() for p in model.parameters()]


def sizes_for(rank: int, tick: int) -> int:
    """Uneven micro-batch sizes; rank 1 sits out every third tick (fewer micro-batches)."""
    if rank == 1 and tick % 3 == 2:
        return 0
    return 2 + (tick * (5 + 2 * rank)) % 7


def one_window(rank: int, world: int, policy: str):
    model = make_model()
    optimizer = RecordingOptimizer(model.parameters())
    window = WindowAccumulator(list(model.parameters()), optimizer, POLICIES[policy])
    xs, ys, tick = [], [], 0
    while True:
        size = sizes_for(rank, tick)
        last = window.begin_microbatch(size)
        if size:
            x, y = make_batch(rank, tick, size)
            xs.append(x)
            ys.append(y)
            window.backward(token_sum_loss(model, x, y))
        tick += 1
        if last:
            record = window.close(lr=0.1)
            break
    return {"grads": optimizer.seen[0], "xs": xs, "ys": ys, "ticks": tick, "record": record}


def assert_same_gradient(got, expected):
    for g, e in zip(got, expected, strict=True):
        assert torch.linalg.norm(g - e) <= 1e-10 * torch.linalg.norm(e)


@pytest.mark.parametrize("policy", POLICIES)
def test_window_gradient_is_big_batch_gradient_one_rank(policy):
    out = one_window(0, 1, policy)
    assert len(out["xs"]) > 1, "the window should hold several micro-batches"
    assert len({len(x) for x in out["xs"]}) > 1, "micro-batch sizes should differ"
    assert_same_gradient(out["grads"], reference_gradient(make_model(), out["xs"], out["ys"]))
    assert out["record"].tokens == sum(len(x) for x in out["xs"])


def every_policy_one_window(rank: int, world: int) -> dict:
    """One process group for all four policies: spawning is most of these tests' time."""
    return {policy: one_window(rank, world, policy) for policy in POLICIES}


@pytest.mark.slow
def test_window_gradient_is_big_batch_gradient_two_ranks():
    by_rank = run_ranks(every_policy_one_window, 2)
    for policy in POLICIES:
        ranks = [by_rank[0][policy], by_rank[1][policy]]
        assert ranks[0]["ticks"] == ranks[1]["ticks"], f"{policy}: ranks must close together"
        counts = [len(r["xs"]) for r in ranks]
        assert counts[0] != counts[1], f"{policy}: ranks should accumulate different counts"
        xs = ranks[0]["xs"] + ranks[1]["xs"]
        ys = ranks[0]["ys"] + ranks[1]["ys"]
        expected = reference_gradient(make_model(), xs, ys)
        for r in ranks:
            assert_same_gradient(r["grads"], expected)
            assert r["record"].tokens == sum(len(x) for x in xs), policy
            assert r["record"].microbatches == sum(counts), policy


def slow_rank_windows(rank: int, world: int, slow_rank: int):
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    window = WindowAccumulator(
        list(model.parameters()), optimizer, WindowConfig(policy="seconds", seconds=0.06)
    )
    closes, tick = [], 0
    while len(closes) < 6:
        last = window.begin_microbatch(4)
        time.sleep(0.02 if rank == slow_rank else 0.002)  # one rank 10x slower
        x, y = make_batch(rank, tick, 4)
        window.backward(token_sum_loss(model, x, y))
        tick += 1
        if last:
            window.close(lr=0.01)
            closes.append(tick)
    return closes, [p.detach().clone() for p in model.parameters()]


def both_slow_ranks(rank: int, world: int) -> dict:
    return {slow: slow_rank_windows(rank, world, slow) for slow in (0, 1)}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_seconds_policy_with_a_slow_rank_closes_together():
    by_rank = run_ranks(both_slow_ranks, 2)
    for slow_rank in (0, 1):  # rank 0 (whose clock decides) slow, then rank 1 slow
        (closes0, params0), (closes1, params1) = by_rank[0][slow_rank], by_rank[1][slow_rank]
        assert closes0 == closes1, f"slow rank {slow_rank}: same closing micro-batch index"
        assert all(b - a >= 2 for a, b in zip([0, *closes0], closes0, strict=False))
        for a, b in zip(params0, params1, strict=True):
            assert torch.equal(a, b)


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


def nan_on_one_rank(rank: int, world: int):
    model = make_model()
    before = [p.detach().clone() for p in model.parameters()]
    window = WindowAccumulator(
        list(model.parameters()),
        torch.optim.SGD(model.parameters(), lr=0.1),
        WindowConfig(microbatches=2),
    )
    for tick in range(2):
        window.begin_microbatch(3)
        x, y = make_batch(rank, tick, 3)
        if rank == 1 and tick == 1:
            y = y * math.nan
        window.backward(token_sum_loss(model, x, y))
    record = window.close(lr=0.1)
    unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    return record.stepped, unchanged


@pytest.mark.slow
def test_non_finite_loss_on_one_rank_skips_the_step_everywhere():
    assert run_ranks(nan_on_one_rank, 2) == [(False, True), (False, True)]


def ticks_to_close(snr: float, signal: bool, seed: int) -> int:
    model = make_model()
    window = WindowAccumulator(
        list(model.parameters()),
        torch.optim.SGD(model.parameters(), lr=0.0),
        WindowConfig(policy="grad_norm", snr=snr, max_microbatches=200),
    )
    for tick in range(200):
        last = window.begin_microbatch(8)
        batch = (
            make_batch(seed, tick, 8) if signal else pure_noise_batch(model, 1000 * seed + tick, 8)
        )
        window.backward(token_sum_loss(model, *batch))
        if last:
            return tick + 1
    raise AssertionError("the cap must close the window")


def test_grad_norm_policy_follows_the_signal_to_noise_ratio():
    seeds = range(5)
    low = sorted(ticks_to_close(2.0, True, s) for s in seeds)
    high = sorted(ticks_to_close(32.0, True, s) for s in seeds)
    noise = sorted(ticks_to_close(2.0, False, s) for s in seeds)
    # A higher threshold needs a longer window (SNR grows with the tokens in it) ...
    assert low[2] * 3 < high[2], (low, high)
    # ... and a gradient with no signal never reaches it: the cap closes those windows.
    assert noise[2] > 4 * low[2], (low, noise)
