"""Run one training config outside Ray: in this process, or as N local gloo processes
(`run_ranks`, which tests and benchmarks use to run any function on N ranks)."""

from __future__ import annotations

import faulthandler
import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from schedule_search.train.config import TrainConfig
from schedule_search.train.loop import train
from schedule_search.train.session import LocalSession
from schedule_search.train.state import TrainResult

__all__ = ["free_port", "run_local", "run_ranks"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_local(
    config: TrainConfig, run_dir: str | Path, workers: int = 1, source: str = "config"
) -> TrainResult:
    """Train `config` with `workers` data-parallel processes; returns rank 0's result.

    Under torchrun (RANK/WORLD_SIZE set) this process is one rank of that group instead.
    """
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and not dist.is_initialized():
        dist.init_process_group("gloo")
        try:
            result = train(config, LocalSession(run_dir, config.checkpoint.keep), source)
            _leave_together()
            return result
        finally:
            dist.destroy_process_group()
    if workers == 1:
        return train(config, LocalSession(run_dir, config.checkpoint.keep), source)
    return run_ranks(_train_rank, workers, config, str(run_dir), source)[0]


def _train_rank(
    rank: int, world_size: int, config: TrainConfig, run_dir: str, source: str
) -> TrainResult:
    return train(config, LocalSession(run_dir, config.checkpoint.keep), source)


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any) -> list[Any]:
    """Run `fn(rank, world_size, *args)` in `world_size` spawned processes joined in one gloo
    group on this machine; their return values, by rank. A rank that raises fails the call
    (`torch.multiprocessing.ProcessRaisedException`, with that rank's traceback)."""
    context = mp.get_context("spawn")
    # The ranks meet through a file, not a TCP port: a port probed free here can be taken by
    # another process before rank 0 listens on it (seen as EADDRINUSE beside Ray's nodes).
    with context.Manager() as manager, tempfile.TemporaryDirectory() as folder:
        results = manager.dict()
        mp.spawn(
            _rank,
            args=(world_size, f"file://{folder}/rendezvous", fn, args, results),
            nprocs=world_size,
            join=True,
        )
        return [results[rank] for rank in range(world_size)]


def _rank(
    rank: int,
    world_size: int,
    rendezvous: str,
    fn: Callable[..., Any],
    args: tuple,
    results: Any,
) -> None:
    faulthandler.enable()  # a native abort in a rank prints that rank's Python stack
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world_size)
    try:
        results[rank] = fn(rank, world_size, *args)
        _leave_together()
    finally:
        dist.destroy_process_group()


def _leave_together() -> None:
    """Wait, through the rendezvous store, until every rank has finished its last collective.

    Gloo can abort a peer whose last messages are still queued when a process destroys its
    group right after a barrier (pytorch/gloo#155; seen once in CI as a SIGABRT in rank 1 at
    the end of a run). The store is not a gloo pair, so this handshake has nothing in flight
    to lose; rank 0 leaves last (under torchrun it hosts the TCP store).
    """
    store = dist.distributed_c10d._get_default_store()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    store.set(f"finished/{rank}", "1")
    store.wait([f"finished/{other}" for other in range(world_size)])
    if rank == 0:
        store.wait([f"left/{other}" for other in range(1, world_size)])
    else:
        store.set(f"left/{rank}", "1")
