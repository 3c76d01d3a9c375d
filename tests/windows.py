"""The window tests' shared pieces (one rank in tests/unit/core/test_window.py, real gloo
ranks in tests/integration/core/test_window_ranks.py): a small float64 model, uneven
micro-batches, and the big-batch reference gradient a window must step with."""

import torch

from schedule_search.core.window import WindowAccumulator, WindowConfig

#: `seconds` is long enough for many micro-batches (a few ms each) even when a loaded machine
#: stalls a rank for a while: a window closed within its first two micro-batches would hold as
#: many on both ranks and the two-rank test would have no uneven window to check (seen once
#: at 0.05 s, on a machine running two tests at once).
POLICIES = {
    "microbatches": WindowConfig(policy="microbatches", microbatches=5, clip_norm=None),
    "tokens": WindowConfig(policy="tokens", tokens=40, clip_norm=None),
    "seconds": WindowConfig(policy="seconds", seconds=0.25, clip_norm=None),
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
