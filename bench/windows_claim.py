"""The practitioner's claim, tested honestly: windows cut training time by 35-50% for under
0.5% change in quality.

On the communication-heavy model of `bench/windows.py` (2 gloo workers), DDP (a step per
micro-batch) trains the bench's budget at each LR of a small grid; its best final validation
loss is the target and its training time the reference. Windows of K = 1, 4, 16 micro-batches a
rank then train up to twice that budget at each LR of a grid centred on sqrt(K) times DDP's
best (larger windows want a larger LR), evaluated every 16 micro-batches a rank (evaluation time
is not counted). Every grid is extended by x2 steps at an edge until its best is interior (2
steps a side at most, marked when hit), like the transfer's envelopes. Per K, at its best LR:
the training time to reach DDP's loss (and the time saved), and the loss at DDP's training
time (and its change).

Run: `python bench/windows_claim.py [--microbatches M]` (part of `make bench`).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from windows import COMM_HEAVY, optimizer_for, run_ddp

from schedule_search.core.window import WindowAccumulator, WindowConfig
from schedule_search.tasks.registry import build_task
from schedule_search.train.launch import run_ranks
from schedule_search.transfer.lr_grid import GridState, grid_state

DDP_LRS = [2.5e-4, 5e-4, 1e-3]
KS = (1, 4, 16)
EVERY = 16  # micro-batches a rank between evaluations


@dataclass
class Curve:
    """Validation loss against training seconds (evaluation excluded)."""

    lr: float
    points: list[tuple[float, float]] = field(default_factory=list)

    def time_to(self, target: float) -> float:
        return next((t for t, loss in self.points if loss <= target), math.inf)

    def loss_at(self, seconds: float) -> float:
        before = [loss for t, loss in self.points if t <= seconds]
        return before[-1] if before else math.inf


def train_windows(task, batches, k: int, lr: float, target: float, ddp_s: float) -> Curve:
    """Windows of k micro-batches a rank until the batches run out, or until the curve has
    both reached `target` and passed `ddp_s` (every figure the table needs is then known)."""
    torch.manual_seed(0)
    model = task.build_model()
    params = list(model.parameters())
    window = WindowAccumulator(params, optimizer_for(model, lr), WindowConfig(microbatches=k))
    curve, trained = Curve(lr), 0.0
    dist.barrier()
    start = time.perf_counter()
    for i, batch in enumerate(batches, start=1):
        last = window.begin_microbatch(batch.tokens)
        window.backward(task.loss_sum(model, batch))
        if last:
            window.close(lr=lr)
        if last and i % EVERY < k:  # the first close at or after each EVERY micro-batches
            trained += time.perf_counter() - start
            curve.points.append((trained, task.evaluate(model)))
            done = curve.time_to(target) < math.inf and trained > ddp_s
            if _any_rank(done or not math.isfinite(curve.points[-1][1])):
                break
            dist.barrier()
            start = time.perf_counter()
    return curve


def _any_rank(flag: bool) -> bool:
    """Whether any rank says so (each rank's clock differs: they must stop together)."""
    agreed = torch.tensor([float(flag)])
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    return bool(agreed.item())


def tuned(run_at: Callable[[float], Any], start: list[float], score: Callable[[Any], float]):
    """Runs at the LRs of `start`, extended by x2 steps at an edge (2 at most a side) until
    the best `score` is interior, as the transfer's envelopes are. Rank 0 decides each next LR
    (scores that use the clock differ between ranks) and tells the others."""
    results: dict[float, Any] = {}
    while True:
        state = grid_state(start, {lr: score(r) for lr, r in results.items()}, 2)
        decided = [state]
        dist.broadcast_object_list(decided, src=0)
        if decided[0].next_lr is None:
            return results, decided[0]
        results[decided[0].next_lr] = run_at(decided[0].next_lr)


def _worker(rank: int, world: int, args) -> dict:
    torch.set_num_threads(1)
    task = build_task(COMM_HEAVY, seed=0)
    batches = [task.microbatch(i, rank, world) for i in range(2 * args.microbatches)]
    run_ddp(task, batches[:8])  # warm-up: gloo pairs, allocator
    ddp, ddp_grid = tuned(
        lambda lr: run_ddp(task, batches[: args.microbatches], lr=lr), DDP_LRS, lambda r: r.loss
    )
    best = [ddp[ddp_grid.best_lr].loss, ddp[ddp_grid.best_lr].seconds]
    dist.broadcast_object_list(best, src=0)  # rank 0's clock for every rank's decisions
    target, ddp_s = best
    curves = {}
    for k in KS:
        centre = ddp_grid.best_lr * math.sqrt(k)

        def score(curve: Curve) -> float:  # reached sooner is better; else a lower loss
            reach = curve.time_to(target)
            return reach if math.isfinite(reach) else 1e6 + curve.loss_at(ddp_s)

        runs, grid = tuned(
            lambda lr, k=k: train_windows(task, batches, k, lr, target, ddp_s),
            [centre / 2, centre, centre * 2],
            score,
        )
        curves[k] = (runs, grid)
    return {"ddp": ddp, "ddp_grid": ddp_grid, "curves": curves}


def edge(state: GridState) -> str:
    return "interior" if state.interior else f"bound hit, {state.bound_hit} edge"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--microbatches", type=int, default=128, help="DDP's budget, per rank")
    args = parser.parse_args()
    started = time.perf_counter()
    out = run_ranks(_worker, 2, args)[0]
    ddp, ddp_grid = out["ddp"], out["ddp_grid"]
    target, ddp_s = ddp[ddp_grid.best_lr].loss, ddp[ddp_grid.best_lr].seconds
    grid = ", ".join(f"{lr:.3g}: {run.loss:.4f}" for lr, run in sorted(ddp.items()))
    print(
        f"DDP, {args.microbatches} micro-batches a rank, LR grid (final loss) {grid}; best LR "
        f"{ddp_grid.best_lr:.3g} ({edge(ddp_grid)}): loss {target:.4f} after {ddp_s:.1f} s of "
        "training\n"
    )
    print(
        "| K | LR grid | best LR | time to DDP's loss | time saved | loss at DDP's time | change |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for k, (curves, grid_state_k) in out["curves"].items():
        best = curves[grid_state_k.best_lr]
        reach, loss = best.time_to(target), best.loss_at(ddp_s)
        lrs = ", ".join(f"{lr:.2g}" for lr in sorted(curves))
        saved = f"{1 - reach / ddp_s:.0%}" if math.isfinite(reach) else "not reached"
        print(
            f"| {k} | {lrs} | {best.lr:.2g} ({edge(grid_state_k)}) | {reach:.1f} s | {saved} "
            f"| {loss:.4f} | {loss / target - 1:+.2%} |"
        )
    print(f"\nbench wall time: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
