"""How far one trained model's loss moves with the held-out sample alone.

Trains the default task (tinylm on the embedded corpus, its default config) once to the
horizon given (4x by default), then scores that one model on the held-out spans each of
seeds 0-9 drew while every seed drew its own (the generator keys `(seed, 0, i, 1)`), and
through `evaluate` with tasks of two seeds, which now share `tinylm.HELD_OUT_KEY`'s sample.
The spread over those samples is what a per-seed held-out sample added to every spread
across seeds.

Run: `python bench/heldout_noise.py [HORIZON]` (about 4 minutes on 2 cores at 4x).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from schedule_search.core import checkpoint
from schedule_search.core.config import parse
from schedule_search.tasks.protocol import Microbatch, seeded_generator
from schedule_search.tasks.registry import build_task
from schedule_search.tasks.tinylm import TinyLMTask
from schedule_search.train.config import TrainConfig
from schedule_search.train.launch import run_local

SEEDS = range(10)


def trained_model(horizon: float) -> torch.nn.Module:
    config = parse(
        TrainConfig,
        {"task": {"name": "tinylm"}, "budget": {"horizon": horizon, "eval_at": []}},
        "heldout_noise",
    )
    with tempfile.TemporaryDirectory() as folder:
        run_local(config, folder)
        state = checkpoint.load_latest(Path(folder) / "checkpoints")[1]
    model = build_task({"name": "tinylm"}, 0).build_model()
    model.load_state_dict(state["model"])
    return model


@torch.no_grad()
def loss_on_spans(task: TinyLMTask, model: torch.nn.Module, key: int) -> float:
    """The mean held-out loss on the spans drawn with generator keys (key, 0, i, 1)."""
    model.eval()
    total, count = 0.0, 0
    for i in range(task.config.eval_batches):
        rows = task._sample_rows(task.corpus.val, seeded_generator(key, 0, i, 1))
        batch = Microbatch(rows, rows.shape[0] * task.config.context)
        total += float(task.loss_sum(model, batch))
        count += batch.tokens
    return total / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("horizon", nargs="?", type=float, default=4.0)
    horizon = parser.parse_args().horizon
    model = trained_model(horizon)
    task = build_task({"name": "tinylm"}, 0)
    assert isinstance(task, TinyLMTask)
    losses = [loss_on_spans(task, model, seed) for seed in SEEDS]
    print(f"one model trained to {horizon:g}x, scored on the samples seeds 0-9 drew:")
    print("  " + " ".join(f"{loss:.4f}" for loss in losses))
    print(f"  sd {statistics.stdev(losses):.4f}, range {max(losses) - min(losses):.4f}")
    shared = [build_task({"name": "tinylm"}, seed).evaluate(model) for seed in (0, 3)]
    print(f"evaluate() now, seeds 0 and 3: {shared[0]:.6f} {shared[1]:.6f}")


if __name__ == "__main__":
    main()
