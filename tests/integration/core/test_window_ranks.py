"""Windowed accumulation on two real gloo ranks: the gradient a window steps with is the
big-batch gradient of the mean token loss for every close policy, ranks close together
when one is slow, a non-finite loss on one rank skips the step everywhere, and a rank that
sits a micro-batch out still gets the global mean gradient."""

import math
import time

import pytest
import torch
from helpers import run_ranks
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


def _sit_out(rank: int, world: int) -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    window = WindowAccumulator(
        list(model.parameters()), optimizer, WindowConfig(microbatches=2, clip_norm=None)
    )
    data = {0: [torch.ones(2, 3), torch.ones(1, 3) * 2], 1: [torch.ones(3, 3) * 3]}
    for x in data[rank] + [None] * (2 - len(data[rank])):
        window.begin_microbatch(0 if x is None else x.shape[0])  # rank 1 sits one out
        if x is not None:
            window.backward(model(x).sum())
    window.close(lr=1.0)
    return model.weight.detach().flatten().tolist()


@pytest.mark.slow
def test_a_rank_that_sits_a_microbatch_out_still_gets_the_global_mean_gradient():
    torch.manual_seed(0)
    start = torch.nn.Linear(3, 1, bias=False).weight.detach().flatten()
    rows = torch.cat([torch.ones(2, 3), torch.ones(1, 3) * 2, torch.ones(3, 3) * 3])
    expected = start - rows.mean(0)  # d/dw of the mean of w.x over the 6 rows, lr 1
    for weights in run_ranks(_sit_out, 2):
        torch.testing.assert_close(torch.tensor(weights), expected, rtol=0, atol=1e-6)
