"""What windows buy: 2 gloo workers on this machine, windows of K micro-batches against DDP
all-reducing the gradient after every micro-batch, over the same micro-batches (same tokens).

Per variant: gradient collectives per optimizer step and per micro-batch, tokens/s (median of
interleaved rounds, the ratio to DDP taken round by round), and the validation loss after the
same tokens (windows take K times fewer, K times larger steps at the same LR: that cost is
shown, not hidden). The model is sized so that communication is a large share of a
synchronized step: the share is measured (DDP step against the same step with no collective)
and printed. Also: the per-micro-batch cost of deciding when a window closes (in
`begin_microbatch`: an all-reduce of the control vector under the tokens, seconds and grad_norm
policies; a local count under the microbatches policy) as a share of the loop, at the default
model.

Run: `python bench/windows.py [--rounds N] [--microbatches M]` (part of `make bench`).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.distributed as dist

from schedule_search.core.window import WindowAccumulator, WindowConfig
from schedule_search.tasks.registry import build_task
from schedule_search.train.launch import run_ranks

# Communication-heavy on purpose: 7.1M non-embedding parameters (28 MiB of fp32 gradient) and
# 64-token micro-batches, so an all-reduce costs about as much as the compute it follows.
COMM_HEAVY = {
    "name": "tinylm",
    "d_model": 384,
    "n_layer": 4,
    "n_head": 6,
    "context": 64,
    "batch": 1,
    "max_bytes": 2_000_000,
    "eval_batches": 32,
}
DEFAULT_MODEL = {"name": "tinylm", "max_bytes": 2_000_000}
KS = (1, 4, 16, 64)
LR = 1e-3


def _optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)


def _step_every_microbatch(task, model, batches) -> float:
    """Seconds for one optimizer step per micro-batch (what DDP does), between barriers."""
    optimizer = _optimizer(model)
    dist.barrier()
    start = time.perf_counter()
    for batch in batches:
        (task.loss_sum(model, batch) / batch.tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    elapsed = time.perf_counter() - start
    dist.barrier()
    return elapsed


def run_ddp(task, batches) -> tuple[float, float, int]:
    """DDP stepping after every micro-batch: one gradient all-reduce (bucketed) per step."""
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(task.build_model())
    elapsed = _step_every_microbatch(task, model, batches)
    return elapsed, task.evaluate(model.module), len(batches)


def run_local(task, batches) -> float:
    """The same steps with no collective at all: a synchronized step without communication."""
    torch.manual_seed(0)
    return _step_every_microbatch(task, task.build_model(), batches)


def run_windows(task, batches, k: int, policy: str = "microbatches"):
    """Windows of k micro-batches a rank: one gradient all-reduce per window. Returns (seconds,
    validation loss, windows, seconds in `begin_microbatch`: deciding whether the window
    closes, which under the tokens policy is an all-reduce of the control vector)."""
    torch.manual_seed(0)
    model = task.build_model()
    params = list(model.parameters())
    optimizer = _optimizer(model)
    tokens = k * batches[0].tokens * dist.get_world_size()  # the same windows, by tokens
    config = WindowConfig(policy=policy, microbatches=k, tokens=tokens)
    window = WindowAccumulator(params, optimizer, config)
    control_s = 0.0
    dist.barrier()
    start = time.perf_counter()
    for batch in batches:
        agreed = time.perf_counter()
        last = window.begin_microbatch(batch.tokens)
        control_s += time.perf_counter() - agreed
        window.backward(task.loss_sum(model, batch))
        if last:
            window.close(lr=LR)
    elapsed = time.perf_counter() - start
    dist.barrier()
    return elapsed, task.evaluate(model), window.windows, control_s


def _worker(rank: int, world: int, args) -> dict | None:
    torch.set_num_threads(1)
    task = build_task(COMM_HEAVY, seed=0)
    batches = [task.microbatch(i, rank, world) for i in range(args.microbatches)]
    run_windows(task, batches[:8], 4)  # warm-up: allocator, gloo pairs
    run_ddp(task, batches[:8])
    rounds: dict[str, list] = {}
    for _ in range(args.rounds):
        rounds.setdefault("local", []).append(run_local(task, batches[:32]))
        rounds.setdefault("ddp", []).append(run_ddp(task, batches))
        for k in KS:
            rounds.setdefault(f"k{k}", []).append(run_windows(task, batches, k))
    default = build_task(DEFAULT_MODEL, seed=0)
    default_batches = [default.microbatch(i, rank, world) for i in range(64)]
    run_windows(default, default_batches[:8], 4)
    control = {
        policy: [run_windows(default, default_batches, 4, policy) for _ in range(args.rounds)]
        for policy in ("tokens", "microbatches")
    }
    if rank != 0:
        return None
    return {
        "rounds": rounds,
        "control": control,
        "params": task.chinchilla_params(task.build_model()),
        "tokens": sum(b.tokens for b in batches) * world,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=128, help="per rank, per variant")
    args = parser.parse_args()
    results = run_ranks(_worker, 2, args)[0]
    rounds, tokens, m = results["rounds"], results["tokens"], args.microbatches

    ddp_s = [r[0] for r in rounds["ddp"]]
    local_step = statistics.median(rounds["local"]) / 32
    ddp_step = statistics.median(ddp_s) / m
    print(
        f"2 gloo workers, 1 thread each; model: tinylm d_model 384, 4 layers "
        f"({results['params']:,} non-embedding params, {results['params'] * 4 / 2**20:.0f} MiB "
        f"of fp32 gradient), 64-token micro-batches, {m} per rank per variant "
        f"({tokens:,} tokens), AdamW lr {LR}, {args.rounds} interleaved rounds"
    )
    print(
        f"communication share of a synchronized (DDP) step: {1 - local_step / ddp_step:.0%} "
        f"(DDP step {ddp_step * 1e3:.1f} ms, same step without collectives "
        f"{local_step * 1e3:.1f} ms; goal >= 30%)"
    )
    print(
        "| variant | grad collectives / step | / micro-batch | optimizer steps | tokens/s "
        "| x DDP | val loss |"
    )
    print("|" + " --- |" * 7)
    ddp_loss = rounds["ddp"][0][1]
    print(
        f"| DDP, step every micro-batch | 1 | 1 | {m} | "
        f"{tokens / statistics.median(ddp_s):,.0f} | 1.00 | {ddp_loss:.4f} |"
    )
    for k in KS:
        runs = rounds[f"k{k}"]
        ratio = statistics.median(d / w[0] for d, w in zip(ddp_s, runs, strict=True))
        print(
            f"| windows, K = {k} | 1 | {1 / k:.3g} | {runs[0][2]} | "
            f"{tokens / statistics.median(w[0] for w in runs):,.0f} | {ratio:.2f} | "
            f"{runs[0][1]:.4f} |"
        )
    for policy, runs in results["control"].items():
        share = statistics.median(c[3] / c[0] for c in runs)
        per_mb = statistics.median(c[3] for c in runs) / 64
        how = (
            "an all-reduce of the 9-float control vector before each micro-batch"
            if policy == "tokens"
            else "a local count; the token count is agreed once, at close"
        )
        print(
            f"deciding a window's close, default model, windows of 4 micro-batches a rank, "
            f"{policy} policy ({how}): {share:.2%} of the loop's time "
            f"({per_mb * 1e6:.0f} us per micro-batch; goal <= 2%)"
        )
    assert all(math.isfinite(r[1]) for r in rounds["ddp"])


if __name__ == "__main__":
    main()
