"""The GPU path: a one-trial sweep with `--gpus-per-worker 1` (NCCL between workers, bf16
autocast), the code path a GPU user runs. Skipped, with exit code 0, where no CUDA device is
visible: this machine, and CI.

Checks what ran: every worker's device (cuda:N) and collective backend (nccl), from the
trial's `workers/rank-<r>.json`; prints tokens/s and the loss at 1x.

Run: `python bench/gpu.py [--workers N]` (default: every visible GPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

import torch
from one_trial import sweep_one_trial


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("GPU path: skipped (no CUDA device visible)")
        return 0
    workers = args.workers or torch.cuda.device_count()
    with tempfile.TemporaryDirectory() as storage:
        experiment = sweep_one_trial(
            storage, "gpu", "--horizon", "1", "--workers", str(workers), "--gpus-per-worker", "1"
        )
        (trial_id,) = experiment.trial_ids()
        placements = [
            json.loads(p.read_text())
            for p in sorted((experiment.trial_dir(trial_id) / "workers").glob("rank-*.json"))
        ]
        last = experiment.read_trial_json(trial_id, "metrics.json")[-1]
    devices = sorted(p["device"] for p in placements)
    backends = {p["backend"] for p in placements}
    print(
        f"GPU path: {workers} worker(s) on {devices}, backend {backends}, "
        f"{last['tokens_per_s']:,.0f} tokens/s, val_loss {last['val_loss']:.4f} at 1x"
    )
    ok = all(d.startswith("cuda") for d in devices) and backends == {"nccl"}
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
