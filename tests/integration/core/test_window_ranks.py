"""Windowed accumulation on two real gloo ranks: the gradient a window steps with is the
big-batch gradient of the mean token loss over the micro-batches each rank did, for every
close policy; under `seconds` a fast rank does not wait for a slow one inside a window; a
non-finite loss on one rank skips the step everywhere; a rank that sits a micro-batch out
still gets the global mean gradient."""

import math
import time

import pytest
import torch
from helpers import run_ranks
from windows import (
    POLICIES,
    RecordingOptimizer,
    assert_same_gradient,
    make_batch,
    make_model,
    one_window,
    reference_gradient,
    token_sum_loss,
)

from schedule_search.core.window import WindowAccumulator, WindowConfig


def every_policy_one_window(rank: int, world: int) -> dict:
    """One process group for all four policies."""
    return {policy: one_window(rank, world, policy) for policy in POLICIES}


@pytest.mark.slow
def test_window_gradient_is_big_batch_gradient_two_ranks():
    by_rank = run_ranks(every_policy_one_window, 2)
    for policy in POLICIES:
        ranks = [by_rank[0][policy], by_rank[1][policy]]
        if policy in ("microbatches", "grad_norm"):  # a length in micro-batches, the same
            assert ranks[0]["ticks"] == ranks[1]["ticks"], policy
        counts = [len(r["xs"]) for r in ranks]
        assert counts[0] != counts[1], f"{policy}: ranks should accumulate different counts"
        xs = ranks[0]["xs"] + ranks[1]["xs"]
        ys = ranks[0]["ys"] + ranks[1]["ys"]
        expected = reference_gradient(make_model(), xs, ys)
        for r in ranks:
            assert_same_gradient(r["grads"], expected)
            assert r["record"].tokens == sum(len(x) for x in xs), policy
            assert r["record"].microbatches == sum(counts), policy


WINDOW_S, FAST_S, SLOW_S = 0.3, 0.005, 0.02  # one rank 4x slower


def straggler_windows(rank: int, world: int, slow_rank: int) -> dict:
    """Six `seconds` windows with one rank 4x slower per micro-batch (an injected sleep, as
    for data loading): what each rank contributed, and how long each window took on it."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    window = WindowAccumulator(
        list(model.parameters()), optimizer, WindowConfig(policy="seconds", seconds=WINDOW_S)
    )
    counts, seconds, tick = [], [], 0
    while len(counts) < 6:
        last = window.begin_microbatch(4)
        time.sleep(SLOW_S if rank == slow_rank else FAST_S)
        x, y = make_batch(rank, tick, 4)
        window.backward(token_sum_loss(model, x, y))
        tick += 1
        if last:
            counts.append(window.local_microbatches)
            seconds.append(window.close(lr=0.01).seconds)
    return {
        "counts": counts,
        "seconds": seconds,
        "params": [p.detach() for p in model.parameters()],
    }


def both_stragglers(rank: int, world: int) -> dict:
    return {slow: straggler_windows(rank, world, slow) for slow in (0, 1)}


@pytest.mark.slow
@pytest.mark.timeout(120)  # a deadlock fails here
def test_seconds_windows_do_not_wait_for_a_slow_rank():
    by_rank = run_ranks(both_stragglers, 2)
    for slow in (0, 1):  # rank 0 slow, then rank 1 slow
        fast_run, slow_run = by_rank[1 - slow][slow], by_rank[slow][slow]
        for fast, lagging in zip(fast_run["counts"], slow_run["counts"], strict=True):
            assert fast >= 2 * lagging, (fast_run["counts"], slow_run["counts"])
        for run in (fast_run, slow_run):  # no window longer than its length + one micro-batch
            # (of the slow rank, which the close waits for) and a little scheduling slack
            assert max(run["seconds"]) <= WINDOW_S + SLOW_S + 0.05, run["seconds"]
        for a, b in zip(fast_run["params"], slow_run["params"], strict=True):
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


def nan_gradient_on_one_rank(rank: int, world: int) -> dict:
    """A finite loss but a NaN in rank 1's gradient (as an overflow in backward gives), for
    every close: plain, bf16 and int8 (whose shared scale must carry it to rank 0 too)."""
    out = {}
    for kind in ("none", "bf16", "int8"):
        model = make_model()
        before = [p.detach().clone() for p in model.parameters()]
        params = list(model.parameters())
        config = WindowConfig(microbatches=1, compression=kind)
        window = WindowAccumulator(params, torch.optim.SGD(params, lr=0.1), config)
        window.begin_microbatch(3)
        x, y = make_batch(rank, 0, 3)
        if rank == 1:  # inside the backward, before an overlapped close sends the gradient
            params[0].register_hook(lambda grad: grad * math.nan)
        window.backward(token_sum_loss(model, x, y))
        record = window.close(lr=0.1)
        unchanged = all(torch.equal(a, b) for a, b in zip(before, params, strict=True))
        out[kind] = (record.stepped, unchanged)
    return out


@pytest.mark.slow
def test_a_non_finite_gradient_on_one_rank_skips_the_step_everywhere_compressed_or_not():
    for by_rank in run_ranks(nan_gradient_on_one_rank, 2):
        assert by_rank == {kind: (False, True) for kind in ("none", "bf16", "int8")}


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


def fresh_window_state(config: WindowConfig) -> dict:
    """The shared state of a window accumulator before its first close."""
    return {"tokens_seen": 0, "windows": 0, "length": config.min_microbatches}


def fp32_windows(rank: int, config: WindowConfig, windows: int, state=None):
    """`windows` windows of 2 micro-batches (rank 1 sits out the last one of odd windows) on
    a float32 model with a parameter no loss reaches; returns the parameters, the gradients
    each step was given, and the window's state (shared, this rank's)."""
    model = make_model().float()
    unused = torch.nn.Parameter(torch.zeros(3))
    params = [unused, *model.parameters()]  # its bucket is the last to be launched
    optimizer = RecordingOptimizer(params) if state is not None else torch.optim.Adam(params)
    window = WindowAccumulator(params, optimizer, config)
    if state:
        window.load_state_dict(state[0])
        window.load_rank_state_dict(state[1])
    start = window.windows
    for w in range(start, start + windows):
        for tick in range(2):
            sits_out = rank == 1 and tick == 1 and w % 2 == 1
            window.begin_microbatch(0 if sits_out else 3)
            if not sits_out:
                x, y = make_batch(rank, 10 * w + tick, 3)
                window.backward(token_sum_loss(model, x.float(), y.float()))
        window.close(lr=1e-2)
    seen = getattr(optimizer, "seen", [])
    return [p.detach() for p in params], seen, (window.state_dict(), window.rank_state_dict())


def overlap_and_feedback(rank: int, world: int) -> dict:
    tiny = 1e-4  # MB: a bucket or two per parameter, so the overlap has buckets to order
    out = {
        overlap: fp32_windows(
            rank, WindowConfig(microbatches=2, overlap=overlap, bucket_mb=tiny), 6
        )[0]
        for overlap in (True, False)
    }
    for kind in ("none", "bf16", "int8"):
        config = WindowConfig(microbatches=2, clip_norm=None, compression=kind)
        out[kind] = fp32_windows(rank, config, 40, state=(fresh_window_state(config), {}))
    config = WindowConfig(microbatches=2, clip_norm=None, compression="int8")
    fresh = (fresh_window_state(config), {})
    _, first, saved = fp32_windows(rank, config, 20, state=fresh)
    out["resumed"] = first + fp32_windows(rank, config, 20, state=saved)[1]
    return out


@pytest.mark.slow
def test_overlapped_close_is_the_plain_close_bit_for_bit_and_error_feedback_is_bounded():
    by_rank = run_ranks(overlap_and_feedback, 2)
    for out in by_rank:
        for a, b in zip(out[True], out[False], strict=True):  # six Adam steps, fp32
            assert torch.equal(a, b)
    exact = [torch.cat([g.flatten() for g in step]) for step in by_rank[0]["none"][1]]
    for kind in ("bf16", "int8"):
        steps = [torch.cat([g.flatten() for g in step]) for step in by_rank[0][kind][1]]
        for mine, theirs in zip(by_rank[0][kind][1], by_rank[1][kind][1], strict=True):
            assert all(torch.equal(a, b) for a, b in zip(mine, theirs, strict=True))
        errors = [float(torch.linalg.norm(s - e)) for s, e in zip(steps, exact, strict=True)]
        drift = [
            float(torch.linalg.norm(sum(steps[: t + 1]) - sum(exact[: t + 1])))
            for t in range(len(exact))
        ]
        # Error feedback: what one window's rounding dropped is sent in the next, so the sum of
        # the compressed updates stays within about one window's error of the exact sum ...
        assert max(drift) <= 2 * max(errors), (kind, max(drift), max(errors))
        # ... where dropping it would let the errors add up (a random walk over 40 windows).
        assert drift[-1] < 0.5 * sum(errors), (kind, drift[-1], sum(errors))
    # The residual travels with a checkpoint: 20 + 20 windows resumed == 40 straight.
    for out in by_rank:
        straight = out["int8"][1]
        for got, want in zip(out["resumed"], straight, strict=True):
            for g, w in zip(got, want, strict=True):
                assert torch.equal(g, w)
