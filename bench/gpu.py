"""The GPU path: a one-trial sweep with `--gpus-per-worker 1` (NCCL between workers, bf16
autocast), the code path a GPU user runs, replicated and, given two GPUs or more, sharded
(`sharding: fsdp`: FSDP2 over NCCL; one GPU cannot hold two NCCL ranks). Skipped, with exit
code 0, where no CUDA device is visible: this machine, and CI.

Checks what ran: every worker's device (cuda:N) and collective backend (nccl), from the
trial's `workers/rank-<r>.json`; prints tokens/s and the loss at 1x.

Run: `python bench/gpu.py [--workers N]` (default: every visible GPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
import yaml
from one_trial import DEFAULT_SPACE, sweep_one_trial


def one_trial(storage: str, sharding: str, workers: int) -> bool:
    """One trial of the default space on `workers` GPUs; whether it ran where it should."""
    space = yaml.safe_load(DEFAULT_SPACE.read_text())
    space.setdefault("base", {})["sharding"] = sharding
    path = Path(storage) / f"{sharding}.yaml"
    path.write_text(yaml.safe_dump(space))
    experiment = sweep_one_trial(
        storage,
        sharding,
        "--horizon",
        "1",
        "--workers",
        str(workers),
        "--gpus-per-worker",
        "1",
        space=path,
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
        f"GPU path ({sharding}): {workers} worker(s) on {devices}, backend {backends}, "
        f"{last['tokens_per_s']:,.0f} tokens/s, val_loss {last['val_loss']:.4f} at 1x"
    )
    return all(d.startswith("cuda") for d in devices) and backends == {"nccl"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("GPU path: skipped (no CUDA device visible)")
        return 0
    workers = args.workers or torch.cuda.device_count()
    with tempfile.TemporaryDirectory() as storage:
        ok = one_trial(storage, "replicated", workers)
        if workers >= 2:
            ok = one_trial(storage, "fsdp", workers) and ok
        else:
            print("GPU path (fsdp): skipped (sharding needs 2 GPUs; 1 is visible)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
