"""What sharding (FSDP2) buys and costs under windows, replicated and fsdp side by side.

1. Memory: peak resident memory a rank adds for parameters, gradients and AdamW state (the
   process's peak RSS minus its RSS before the model is built; activations are kept small by one
   short sequence a micro-batch, and the EMA bank is off). glibc's malloc keeps freed blocks
   below its mmap threshold, which it raises as large blocks are freed, so an allocator that
   frees and reallocates gathered weights every micro-batch (FSDP) would read as holding them
   all: the ranks run with a fixed threshold (`MALLOC_MMAP_THRESHOLD_`), so every large tensor
   is mapped and unmapped and RSS follows the live tensors. The model is one where AdamW's two
   moments dominate; 2 and 4 ranks, windows of 1 and 4 micro-batches. Beside it, what the
   tensors alone should take in units of P (the parameters' bytes): replicated 4P (weights,
   gradient buffer, two moments); fsdp 3P / W (weight and moment shards), plus the gradient: its
   shard P / W for a window of one micro-batch (each module's gradient is reduce-scattered as
   the backward makes it), the unsharded sum P for a longer window (what accumulating inside a
   window costs), plus P for the policies that hold the gathered weights through a window
   (tokens, seconds). And the measured figure less the replicated run's memory beyond its 4P
   (activations, allocator, kernels: assumed the same in both).
2. Throughput: tokens/s of both at windows of 1, 4 and 16 micro-batches on 2 ranks, rounds
   interleaved, ratios taken round by round: fsdp gathering per module (`microbatches`
   windows) and holding the gathered weights through the window (`tokens` windows of the
   same length).

Run: `python bench/sharding.py [--rounds N]` (part of `make bench`). On a GPU (NCCL) the same
code path runs where `bench/gpu.py` runs a sweep; this machine has none.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

import torch

from schedule_search.core.config import parse
from schedule_search.core.optimizer import OptimizerConfig
from schedule_search.core.sharding import ShardedGradients, shard_model
from schedule_search.core.window import WindowAccumulator, WindowConfig
from schedule_search.tasks.registry import build_task
from schedule_search.train.launch import run_ranks

#: AdamW state dominates: 25M non-embedding parameters (P = 96 MiB), 64-token micro-batches
#: (activations of a few MiB).
MODEL = {
    "name": "tinylm",
    "d_model": 512,
    "n_layer": 8,
    "n_head": 8,
    "context": 64,
    "batch": 1,
    "max_bytes": 1_000_000,
}
PAGE = resource.getpagesize()


def _rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * PAGE


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _train(
    rank: int, world: int, sharding: str, k: int, policy: str, windows: int, seed: int
) -> dict:
    torch.set_num_threads(1)
    task = build_task(MODEL, seed, "bench")
    before = _rss()
    model = task.build_model()
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if sharding == "fsdp":
        model = shard_model(model)
    params = list(model.parameters())
    optimizer = OptimizerConfig(lr=1e-3).build(params)
    config = parse(
        WindowConfig, {"policy": policy, "microbatches": k, "tokens": k * 64 * world}, "bench"
    )
    gradients = ShardedGradients.for_window(model, params, config) if sharding == "fsdp" else None
    window = WindowAccumulator(params, optimizer, config, gradients=gradients)
    tokens, tick, started = 0, 0, 0.0
    for index in range(windows + 1):
        if index == 1:  # the first window (lazy state, warm caches) is not timed
            started, tokens = time.perf_counter(), 0
        while True:
            batch = task.microbatch(tick, rank, world)
            tick += 1
            last = window.begin_microbatch(batch.tokens)
            window.backward(task.loss_sum(model, batch))
            tokens += batch.tokens
            if last:
                window.close(1e-3)
                break
    seconds = time.perf_counter() - started
    return {
        "added": _peak_rss() - before,
        "param_bytes": param_bytes,
        "tokens_per_s": tokens / seconds,
    }


def _expected(sharding: str, k: int, world: int, policy: str) -> float:
    """The tensors' bytes in units of P (module docstring)."""
    if sharding == "replicated":
        return 4.0
    gradient = 1.0 / world if k == 1 else 1.0
    held = 1.0 if policy != "microbatches" else 0.0
    return 3.0 / world + gradient + held


def memory() -> None:
    print("## Memory per rank (peak RSS added by the model, its gradients and AdamW)\n")
    print(
        "| ranks | window | sharding | policy | MiB added | x replicated | tensors (P) "
        "| less replicated's overhead |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for world in (2, 4):
        for k in (1, 4):
            rows = [("replicated", "microbatches"), ("fsdp", "microbatches")]
            if k > 1:
                rows.append(("fsdp", "tokens"))
            reference = overhead = 0.0
            for sharding, policy in rows:
                results = run_ranks(_train, world, sharding, k, policy, 3, 0)
                added = max(r["added"] for r in results)
                tensors = 4 * results[0]["param_bytes"]
                reference = reference or added
                overhead = overhead or added - tensors
                expected = _expected(sharding, k, world, policy)
                print(
                    f"| {world} | {k} | {sharding} | {policy} | {added / 2**20:.1f} | "
                    f"{added / reference:.2f} | {expected:.2f} ({expected / 4:.2f}x) | "
                    f"{(added - overhead) / tensors:.2f}x |"
                )
    megabytes = results[0]["param_bytes"] / 2**20
    print(f"\nP = {megabytes:.1f} MiB (the model's fp32 parameters)\n")


def throughput(rounds: int) -> None:
    print("## Tokens/s on 2 ranks (one thread each)\n")
    print(
        "| window | replicated | fsdp, gathered per module | x replicated (rounds) "
        "| fsdp, held through the window | x replicated (rounds) |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    runs = {"replicated": "microbatches", "fsdp": "microbatches", "held": "tokens"}
    for k in (1, 4, 16):
        windows = max(48 // k, 4)
        speeds: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(rounds):
            for name, policy in runs.items():
                sharding = "replicated" if name == "replicated" else "fsdp"
                results = run_ranks(_train, 2, sharding, k, policy, windows, 0)
                speeds[name].append(sum(r["tokens_per_s"] for r in results))
        cells = [f"{statistics.median(speeds['replicated']):,.0f}"]
        for name in ("fsdp", "held"):
            ratios = [s / r for s, r in zip(speeds[name], speeds["replicated"], strict=True)]
            cells += [
                f"{statistics.median(speeds[name]):,.0f}",
                f"{statistics.median(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)})",
            ]
        print(f"| {k} | {' | '.join(cells)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    started = time.perf_counter()
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(1 << 20)  # read by each spawned rank at start
    memory()
    del os.environ["MALLOC_MMAP_THRESHOLD_"]  # the allocator's own behaviour for speed
    throughput(args.rounds)
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
