"""Training-core benchmark: ratios measured side by side in one run (these machines are noisy).

- loop overhead: the windowed loop (WindowAccumulator + token clock + EMA bank, as train/loop.py
  runs it) over a bare PyTorch loop doing the same micro-batches with plain accumulation,
  interleaved A/B rounds, median of the per-round ratios. Goal <= 1.03.
- memory: peak RSS of a 64-micro-batch window over a 1-micro-batch window, each in a fresh
  process over the same micro-batches. Goal <= 1.02.
- tokens/s of the default tinylm on one thread, and the FLOP/s that makes, against the
  machine's own matmul throughput at the model's shapes (torch.mm, one thread).
- the EMA bank: seconds per EMA update as a share of a step (one 1-micro-batch window).
  Goal <= 3% per EMA.
- `compile: true`: the windowed loop with the model compiled in place (`Module.compile`, as
  train/loop.py does) against the eager one, interleaved rounds after a first pass of each;
  the first compiled pass's extra seconds over the first eager one are the compile time.

Run: `make bench` or `python bench/core.py [--rounds N]`.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time

import torch

from schedule_search.core.averaging import DEFAULT_FRACTIONS, EmaBank
from schedule_search.core.window import WindowAccumulator, WindowConfig
from schedule_search.tasks.registry import build_task

MICROBATCHES = 32
WINDOW = 4


def setup(seed: int = 0):
    torch.set_num_threads(1)
    task = build_task({"name": "tinylm", "max_bytes": 1_000_000}, seed=seed)
    batches = [task.microbatch(i, 0, 1) for i in range(MICROBATCHES)]
    return task, batches


def bare_loop(task, batches, window: int) -> float:
    model = task.build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    start = time.perf_counter()
    for i, batch in enumerate(batches):
        (task.loss_sum(model, batch) / (batch.tokens * window)).backward()
        if (i + 1) % window == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def windowed_loop(task, batches, window: int, model: torch.nn.Module | None = None) -> float:
    model = task.build_model() if model is None else model
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95))
    accumulator = WindowAccumulator(params, optimizer, WindowConfig(microbatches=window))
    ema = EmaBank(params, [0.0, 0.04])
    start = time.perf_counter()
    for batch in batches:
        last = accumulator.begin_microbatch(batch.tokens)
        accumulator.backward(task.loss_sum(model, batch))
        if last:
            accumulator.close(lr=1e-3)
            ema.update(accumulator.tokens_seen / batch.tokens)
    return time.perf_counter() - start


def memory_probe(window: int) -> None:
    """Child process: run 64 micro-batches in windows of `window`; print peak RSS in KiB."""
    task, _ = setup()
    batches = [task.microbatch(i, 0, 1) for i in range(64)]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    windowed_loop(task, batches, window)
    print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def peak_rss(window: int) -> tuple[int, int]:
    """(peak RSS before the loop, peak RSS after it) in KiB, from a fresh process."""
    out = subprocess.run(
        [sys.executable, __file__, "--memory-probe", str(window)],
        check=True,
        capture_output=True,
        text=True,
    )
    before, after = out.stdout.strip().splitlines()[-1].split()
    return int(before), int(after)


EMA_FRACTIONS = [f for f in DEFAULT_FRACTIONS if f > 0]  # the bank every sweep trial keeps


def ema_cost(task, batches, rounds: int) -> tuple[float, float]:
    """(seconds per step without the EMA update, seconds per EMA update per EMA), medians."""
    model = task.build_model()
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95))
    accumulator = WindowAccumulator(params, optimizer, WindowConfig(microbatches=1))
    ema = EmaBank(params, EMA_FRACTIONS)
    steps, updates = [], []
    for _ in range(rounds):
        for batch in batches:
            start = time.perf_counter()
            accumulator.begin_microbatch(batch.tokens)
            accumulator.backward(task.loss_sum(model, batch))
            accumulator.close(lr=1e-3)
            stepped = time.perf_counter()
            ema.update(accumulator.tokens_seen / batch.tokens)
            updates.append(time.perf_counter() - stepped)
            steps.append(stepped - start)
    return statistics.median(steps), statistics.median(updates) / len(EMA_FRACTIONS)


def compiled_vs_eager(task, batches, rounds: int) -> tuple[float, float, float]:
    """(eager tokens/s, compiled tokens/s, compile seconds), medians over interleaved rounds,
    each round training on from the last (one eager and one compiled model throughout). The
    compile is cold: inductor's on-disk graph caches are off, as on a machine's first run
    (a warm cache makes a later run's compile a fraction of this)."""
    eager_model = task.build_model()
    compiled_model = task.build_model()
    compiled_model.compile()
    eager_first = windowed_loop(task, batches, WINDOW, eager_model)
    with (
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    ):
        compiled_first = windowed_loop(task, batches, WINDOW, compiled_model)
    eager, compiled = [], []
    for _ in range(rounds):
        eager.append(windowed_loop(task, batches, WINDOW, eager_model))
        compiled.append(windowed_loop(task, batches, WINDOW, compiled_model))
    tokens = sum(batch.tokens for batch in batches)
    return (
        tokens / statistics.median(eager),
        tokens / statistics.median(compiled),
        compiled_first - eager_first,
    )


def model_flops_per_token(task) -> float:
    """Forward + backward FLOPs per token: 6 per matmul weight (the blocks' linears and the
    tied head), plus attention's QK^T and AV (12 * context * d_model per layer)."""
    model = task.build_model()
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    head = model.token_embedding.weight.numel()
    config = task.config
    return 6 * (linear + head) + 12 * config.n_layer * config.context * config.d_model


def matmul_flops_per_s(task, repeats: int = 20) -> float:
    """torch.mm throughput (one thread) over the model's matmul shapes, forward and the two
    backward products of each: the machine's ceiling for this model."""
    config, tokens = task.config, task.tokens_per_microbatch
    d, vocab = config.d_model, task.corpus.vocab_size
    shapes = [(tokens, d, 3 * d), (tokens, d, d), (tokens, d, 4 * d), (tokens, 4 * d, d)]
    shapes.append((tokens, d, vocab))
    products = []
    for m, k, n in shapes:  # y = x @ w; dx = dy @ w.T; dw = x.T @ dy
        products += [(m, k, n), (m, n, k), (k, m, n)]
    operands = [(torch.randn(m, k), torch.randn(k, n)) for m, k, n in products]
    flops = sum(2 * m * k * n for m, k, n in products)
    for a, b in operands:
        torch.mm(a, b)
    start = time.perf_counter()
    for _ in range(repeats):
        for a, b in operands:
            torch.mm(a, b)
    return repeats * flops / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--memory-probe", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_probe:
        memory_probe(args.memory_probe)
        return

    task, batches = setup()
    windowed_loop(task, batches, WINDOW)  # warm-up both paths
    bare_loop(task, batches, WINDOW)
    ratios, bare_times, windowed_times = [], [], []
    for _ in range(args.rounds):
        b = bare_loop(task, batches, WINDOW)
        w = windowed_loop(task, batches, WINDOW)
        bare_times.append(b)
        windowed_times.append(w)
        ratios.append(w / b)
    tokens = sum(batch.tokens for batch in batches)
    print(
        f"tinylm default: {task.chinchilla_params(task.build_model()):,} non-embedding params, "
        f"{batches[0].tokens} tokens per micro-batch, 1 thread"
    )
    print(
        f"loop overhead (windowed / bare), windows of {WINDOW}, median of {args.rounds} rounds: "
        f"{statistics.median(ratios):.3f}  (goal <= 1.03; "
        f"rounds {min(ratios):.3f}..{max(ratios):.3f})"
    )
    print(
        f"tokens/s: windowed {tokens / statistics.median(windowed_times):,.0f}, "
        f"bare {tokens / statistics.median(bare_times):,.0f}"
    )
    tokens_per_s = tokens / statistics.median(windowed_times)
    achieved = tokens_per_s * model_flops_per_token(task)
    ceiling = matmul_flops_per_s(task)
    print(
        f"model FLOP/s at {tokens_per_s:,.0f} tokens/s: {achieved / 1e9:.2f} GFLOP/s; torch.mm "
        f"at the model's shapes: {ceiling / 1e9:.2f} GFLOP/s; fraction {achieved / ceiling:.2f}"
    )
    step_s, per_ema_s = ema_cost(task, batches, max(1, args.rounds // 2))
    print(
        f"EMA bank: {per_ema_s * 1e6:.0f} us per EMA per update against a {step_s * 1e3:.1f} ms "
        f"step (1-micro-batch window): {per_ema_s / step_s:.2%} per EMA (goal <= 3%); the "
        f"default bank of {len(EMA_FRACTIONS)}: {len(EMA_FRACTIONS) * per_ema_s / step_s:.1%} "
        "of a step"
    )
    eager_tps, compiled_tps, compile_s = compiled_vs_eager(task, batches, args.rounds)
    print(
        f"compile: true, compiled / eager tokens/s, median of {args.rounds} rounds: "
        f"{compiled_tps / eager_tps:.3f} ({compiled_tps:,.0f} / {eager_tps:,.0f}); "
        f"compile time {compile_s:.1f} s (cold: first compiled pass over an eager one)"
    )
    (small_before, small), (large_before, large) = peak_rss(1), peak_rss(64)
    print(
        f"peak RSS, 64-micro-batch window / 1-micro-batch window: {large / small:.3f} "
        f"({large / 1024:.0f} MiB / {small / 1024:.0f} MiB; goal <= 1.02); growth during "
        f"the loop: {(large - large_before) / 1024:.1f} MiB "
        f"vs {(small - small_before) / 1024:.1f} MiB"
    )


if __name__ == "__main__":
    main()
