"""Run one training config outside Ray: in this process, or as N local gloo processes
(`run_ranks`, which tests and benchmarks use to run any function on N ranks)."""

from __future__ import annotations

import faulthandler
import os
import pickle
import socket
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
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


#: What the forkserver that ranks are forked from imports once: each rank then starts in a
#: fraction of a second, where a spawned one imports torch and the trainer itself (3 s of wall
#: and 4.5 s of CPU for two ranks, each time, on 2 cores; 0.1 s from the second call on).
FORKSERVER_PRELOAD = ["torch", "torch.distributed", "schedule_search.train.loop"]


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any) -> list[Any]:
    """Run `fn(rank, world_size, *args)` in `world_size` processes joined in one gloo group on
    this machine; their return values, by rank. A rank that raises fails the call
    (`torch.multiprocessing.ProcessRaisedException`, with that rank's traceback).

    The ranks are forked from a forkserver (started at the first call, kept for this process's
    life), never from this process, whose threads a fork would copy mid-state. Each rank takes
    this process's current environment, working directory and import path, as a spawned one
    would, not the forkserver's from its start."""
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(FORKSERVER_PRELOAD)
    here = _Place(dict(os.environ), os.getcwd(), list(sys.path))
    # Unpickled in the rank once it stands in `here`: `fn`'s module may lie on a path the
    # forkserver was not started with.
    work = bytes(ForkingPickler.dumps((fn, args)))
    # The ranks meet through a file, not a TCP port: a port probed free here can be taken by
    # another process before rank 0 listens on it (seen as EADDRINUSE beside Ray's nodes).
    with context.Manager() as manager, tempfile.TemporaryDirectory() as folder:
        results = manager.dict()
        mp.start_processes(
            _rank,
            args=(world_size, f"file://{folder}/rendezvous", here, work, results),
            nprocs=world_size,
            join=True,
            start_method="forkserver",
        )
        return [results[rank] for rank in range(world_size)]


@dataclass(frozen=True)
class _Place:
    """Where a rank runs: the caller's environment, working directory and import path."""

    environ: dict[str, str]
    cwd: str
    path: list[str]

    def enter(self) -> None:
        os.environ.clear()
        os.environ.update(self.environ)
        os.chdir(self.cwd)
        sys.path[:] = self.path


def _rank(
    rank: int,
    world_size: int,
    rendezvous: str,
    place: _Place,
    work: bytes,
    results: Any,
) -> None:
    faulthandler.enable()  # a native abort in a rank prints that rank's Python stack
    place.enter()
    fn, args = pickle.loads(work)
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
