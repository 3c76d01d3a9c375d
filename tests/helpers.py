"""Shared test utilities: run a function on N real gloo ranks, write configs."""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp
import yaml

from schedule_search.launch import free_port


def _entry(rank: int, world: int, port: int, fn: Any, args: tuple, results: Any) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        results[rank] = fn(rank, world, *args)
    except BaseException:
        results[rank] = RuntimeError(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Any, world: int, *args: Any) -> list[Any]:
    """Run `fn(rank, world, *args)` in `world` spawned gloo processes; return their results."""
    context = mp.get_context("spawn")
    with context.Manager() as manager:
        results = manager.dict()
        mp.spawn(_entry, args=(world, free_port(), fn, args, results), nprocs=world, join=True)
        return [results[r] for r in range(world)]


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path
