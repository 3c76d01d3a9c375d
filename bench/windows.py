"""What windows buy, on 2 gloo workers on this machine, measured side by side in one run.

1. The cost of deciding when a window closes, every policy, as a share of the loop (default
   tinylm, windows of about 4 micro-batches a rank). Every decision is local now; before, every
   policy but `microbatches` all-reduced a control vector before each micro-batch.
2. Stragglers: `seconds` windows with one rank 2x and 4x slower per micro-batch (an injected
   sleep, as for slow data loading): the fast rank's tokens/s under the lock-step agreement of
   before (re-implemented here as the reference: all-reduce before every micro-batch, close on
   rank 0's clock), under local windows now, and under DDP, against its solo throughput.
3. Overlap: windows of K = 1 and K = 16 micro-batches, the close overlapped with the last
   backward or not, against DDP (which overlaps its bucketed all-reduces) on a model sized so
   that communication is a large share of a synchronized step (the share is measured).
4. Compression: fp32, bf16 and int8 + error feedback closes at K = 1, 4, 16: payload per close,
   tokens/s and the validation loss after the same tokens, and each K's communication share
   (the same windows on a one-rank group: no collective at all).

Run: `python bench/windows.py [--rounds N] [--microbatches M]` (part of `make bench`). The
practitioner's time-to-quality claim is `bench/windows_claim.py`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from schedule_search.core.window import WindowAccumulator, WindowConfig
from schedule_search.tasks.registry import build_task
from schedule_search.train.launch import run_ranks

# Communication-heavy on purpose: 7.1M non-embedding parameters (27 MiB of fp32 gradient) and
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
LR = 1e-3
POLICIES = ("microbatches", "tokens", "seconds", "grad_norm")
#: Bytes a value takes on the wire in each close (int8 also sends one fp32 scale a bucket).
WIRE_BYTES = {"none": 4, "bf16": 2, "int8": 1}


@dataclass
class Run:
    seconds: float
    microbatches: int  # this rank's
    tokens: int  # this rank's
    windows: int
    loss: float = float("nan")
    decision_s: float = 0.0  # inside begin_microbatch


def optimizer_for(model: torch.nn.Module, lr: float = LR) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)


def run_ddp(task, batches, slow_s: float = 0.0, lr: float = LR) -> Run:
    """DDP: one optimizer step per micro-batch, its bucketed all-reduce overlapped with the
    backward; every rank waits for the slowest at every step."""
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(task.build_model())
    optimizer = optimizer_for(model, lr)
    dist.barrier()
    start = time.perf_counter()
    for batch in batches:
        time.sleep(slow_s)
        (task.loss_sum(model, batch) / batch.tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    elapsed = time.perf_counter() - start
    dist.barrier()
    tokens = sum(b.tokens for b in batches)
    return Run(elapsed, len(batches), tokens, len(batches), task.evaluate(model.module))


def run_windows(
    task, batches, config: WindowConfig, *, slow_s=0.0, group=None, evaluate=True, lr=LR
) -> Run:
    """Windows under `config` over `batches` (or until they run out: the `seconds` policy
    stops at the last whole window every rank can finish, agreed at each close)."""
    torch.manual_seed(0)
    model = task.build_model()
    window = WindowAccumulator(list(model.parameters()), optimizer_for(model, lr), config, group)
    decision_s, done = 0.0, 0
    dist.barrier()
    start = time.perf_counter()
    for batch in batches:
        time.sleep(slow_s)
        deciding = time.perf_counter()
        last = window.begin_microbatch(batch.tokens)
        decision_s += time.perf_counter() - deciding
        window.backward(task.loss_sum(model, batch))
        done += 1
        if last:
            window.close(lr=lr)
            if config.policy == "seconds" and _any_rank_short(len(batches) - done, group):
                break
    elapsed = time.perf_counter() - start
    dist.barrier()
    loss = task.evaluate(model) if evaluate else float("nan")
    tokens = sum(b.tokens for b in batches[:done])
    return Run(elapsed, done, tokens, window.windows, loss, decision_s)


def _any_rank_short(left: int, group) -> bool:
    """Whether some rank may run out of micro-batches in the next window (a `seconds` window
    has no fixed length): the run ends at this close on every rank."""
    if dist.get_world_size(group) == 1:
        return left < 64
    flag = torch.tensor([float(left < 64)])
    dist.all_reduce(flag, group=group)
    return bool(flag.item())


def run_lockstep(task, batches, seconds: float, slow_s: float) -> Run:
    """The agreement of before, as the reference: before every micro-batch all ranks
    all-reduce a control vector (rank 0's elapsed time and last micro-batch time) and close
    when rank 0's clock expects to pass the window length, so they move in lock-step."""
    torch.manual_seed(0)
    model = task.build_model()
    params = list(model.parameters())
    window = WindowAccumulator(params, optimizer_for(model), WindowConfig(overlap=False))
    rank, done, windows = dist.get_rank(), 0, 0
    dist.barrier()
    start = time.perf_counter()
    window_start, tick, last_dt = time.perf_counter(), None, 0.0
    for batch in batches[:-64]:
        now = time.perf_counter()
        last_dt, tick = (now - tick if tick else 0.0), now
        control = torch.tensor([now - window_start, last_dt] if rank == 0 else [0.0, 0.0])
        dist.all_reduce(control)
        time.sleep(slow_s)
        window.backward(task.loss_sum(model, batch))
        done += 1
        if float(control.sum()) >= seconds:
            window.close(lr=LR)
            windows += 1
            window_start, tick = time.perf_counter(), None
    elapsed = time.perf_counter() - start
    dist.barrier()
    return Run(elapsed, done, sum(b.tokens for b in batches[:done]), windows)


def microbatch_seconds(task, batches) -> float:
    """The median forward + backward time of one micro-batch on this rank."""
    model = task.build_model()
    times = []
    for batch in batches[:12]:
        start = time.perf_counter()
        task.loss_sum(model, batch).backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:])


def decision_costs(task, batches, rounds: int) -> dict[str, list[Run]]:
    """Every policy at windows of about 4 micro-batches a rank."""
    mb_s = microbatch_seconds(task, batches)
    tokens = batches[0].tokens
    configs = {
        "microbatches": WindowConfig(microbatches=4),
        "tokens": WindowConfig(policy="tokens", tokens=4 * tokens * dist.get_world_size()),
        "seconds": WindowConfig(policy="seconds", seconds=4 * mb_s),
        "grad_norm": WindowConfig(policy="grad_norm", snr=1e9, max_microbatches=4),
    }
    out: dict[str, list[Run]] = {policy: [] for policy in configs}
    for _ in range(rounds):
        for policy, config in configs.items():
            out[policy].append(run_windows(task, batches, config, evaluate=False))
    return out


def stragglers(task, batches, window_s: float) -> dict[str, Run]:
    """`seconds` windows with rank 1 slowed 2x and 4x; lock-step and DDP beside them."""
    mb_s = microbatch_seconds(task, batches)
    config = WindowConfig(policy="seconds", seconds=window_s)
    out = {"solo": run_windows(task, batches, config, evaluate=False)}
    for factor in (2, 4):
        slow_s = (factor - 1) * mb_s if dist.get_rank() == 1 else 0.0
        out[f"windows x{factor}"] = run_windows(
            task, batches, config, slow_s=slow_s, evaluate=False
        )
        out[f"lockstep x{factor}"] = run_lockstep(task, batches, window_s, slow_s)
        out[f"ddp x{factor}"] = run_ddp(task, batches[: len(batches) // factor], slow_s)
    return out


def overlap_and_compression(task, batches, rounds: int) -> dict[str, list[Run]]:
    """DDP and windows at K = 1, 4, 16: overlapped or not, compressed or not, and on a
    one-rank group (the same windows without any collective)."""
    alone = [dist.new_group([r]) for r in range(dist.get_world_size())][dist.get_rank()]
    out: dict[str, list[Run]] = {}
    for _ in range(rounds):
        out.setdefault("ddp", []).append(run_ddp(task, batches))
        for k in (1, 4, 16):
            variants = {
                "overlap": WindowConfig(microbatches=k),
                "plain": WindowConfig(microbatches=k, overlap=False),
                "bf16": WindowConfig(microbatches=k, compression="bf16"),
                "int8": WindowConfig(microbatches=k, compression="int8"),
            }
            for name, config in variants.items():
                out.setdefault(f"k{k} {name}", []).append(run_windows(task, batches, config))
            local = run_windows(task, batches, WindowConfig(microbatches=k), group=alone)
            out.setdefault(f"k{k} local", []).append(local)
    return out


def _worker(rank: int, world: int, args) -> dict | None:
    torch.set_num_threads(1)
    default = build_task(DEFAULT_MODEL, seed=0)
    small = [default.microbatch(i, rank, world) for i in range(max(args.microbatches, 256))]
    heavy_task = build_task(COMM_HEAVY, seed=0)
    heavy = [heavy_task.microbatch(i, rank, world) for i in range(args.microbatches)]
    run_windows(heavy_task, heavy[:8], WindowConfig(microbatches=4))  # warm-up: gloo pairs
    run_ddp(heavy_task, heavy[:8])
    results = {
        "decision": decision_costs(default, small[:64], args.rounds),
        "stragglers": stragglers(default, small, args.window_s),
        "comm": overlap_and_compression(heavy_task, heavy, args.rounds),
        "params": heavy_task.chinchilla_params(heavy_task.build_model()),
        "all_params": sum(p.numel() for p in heavy_task.build_model().parameters()),
    }
    return results


def median_ratio(numerators: list[Run], denominators: list[Run]) -> float:
    """Median over rounds of numerator time / denominator time (a speed-up of the latter)."""
    return statistics.median(
        n.seconds / d.seconds for n, d in zip(numerators, denominators, strict=True)
    )


def print_decision(by_rank: list[dict]) -> None:
    print("\n### Deciding when a window closes (default tinylm, ~4 micro-batches a rank)\n")
    print("| policy | decision share of the loop (both ranks' max) | per micro-batch | goal |")
    print("| --- | --- | --- | --- |")
    for policy in POLICIES:
        share = max(
            statistics.median(r.decision_s / r.seconds for r in rk["decision"][policy])
            for rk in by_rank
        )
        per_mb = max(
            statistics.median(r.decision_s / r.microbatches for r in rk["decision"][policy])
            for rk in by_rank
        )
        print(f"| {policy} | {share:.2%} | {per_mb * 1e6:.0f} us | <= 2% |")


def print_stragglers(by_rank: list[dict], window_s: float) -> None:
    fast, slow = by_rank[0]["stragglers"], by_rank[1]["stragglers"]
    solo = fast["solo"].tokens / fast["solo"].seconds
    print(f"\n### Stragglers: `seconds` windows of {window_s} s, rank 1 slowed (rank 0 fast)\n")
    print(
        f"Fast rank's solo throughput (no slow peer, same windows): {solo:,.0f} tokens/s.\n\n"
        "| slow rank | method | fast rank tokens/s | x solo | micro-batches per window "
        "(fast / slow) | goal |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for factor in (2, 4):
        for method in ("lockstep", "windows", "ddp"):
            f, s = fast[f"{method} x{factor}"], slow[f"{method} x{factor}"]
            rate = f.tokens / f.seconds
            per = f"{f.microbatches / f.windows:.1f} / {s.microbatches / s.windows:.1f}"
            label = {"lockstep": "lock-step (before)", "windows": "local windows (now)"}
            goal = ">= 90%" if method == "windows" else ""
            print(
                f"| {factor}x | {label.get(method, 'DDP')} | {rate:,.0f} | {rate / solo:.0%} "
                f"| {per} | {goal} |"
            )


def print_comm(results: dict, microbatches: int) -> None:
    comm = results["comm"]
    ddp = comm["ddp"]
    n = results["all_params"]
    print(
        f"\n### Overlap and compression: tinylm d_model 384, 4 layers ({results['params']:,} "
        f"non-embedding, {n:,} in all), 64-token micro-batches, {microbatches} a rank\n"
    )
    print(
        "| K | close | payload per rank per close | comm share of a window step "
        "| tokens/s | x DDP | val loss |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    tokens = ddp[0].tokens * 2
    print(
        f"| DDP | per micro-batch, overlapped | {4 * n / 2**20:.1f} MiB | | "
        f"{tokens / statistics.median(r.seconds for r in ddp):,.0f} | 1.00 | {ddp[0].loss:.4f} |"
    )
    for k in (1, 4, 16):
        local = comm[f"k{k} local"]
        for name in ("plain", "overlap", "bf16", "int8"):
            runs = comm[f"k{k} {name}"]
            wire = "none" if name in ("plain", "overlap") else name
            share = 1 - 1 / median_ratio(runs, local) if name == "plain" else None
            print(
                f"| {k} | {name} | {WIRE_BYTES[wire] * n / 2**20:.1f} MiB | "
                f"{'' if share is None else f'{share:.0%}'} | "
                f"{tokens / statistics.median(r.seconds for r in runs):,.0f} | "
                f"{median_ratio(ddp, runs):.2f} | {runs[0].loss:.4f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=128, help="per rank, per variant")
    parser.add_argument("--window-s", type=float, default=0.5)
    args = parser.parse_args()
    started = time.perf_counter()
    by_rank = run_ranks(_worker, 2, args)
    print(
        f"2 gloo workers on this machine, 1 thread each, {args.rounds} interleaved rounds "
        "(medians; ratios taken round by round)"
    )
    print_decision(by_rank)
    print_stragglers(by_rank, args.window_s)
    print_comm(by_rank[0], args.microbatches)
    print(f"\nbench wall time: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
