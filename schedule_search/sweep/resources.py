"""What one trial asks of Ray, checked against what the machine or cluster has before a sweep or
transfer launches: Ray would otherwise keep the trial pending forever ("1 running, 1 waiting")
without a word. A cluster that autoscales is checked against what it has now."""

from __future__ import annotations

import logging
import os

from schedule_search.core.config import ConfigError
from schedule_search.sweep.experiment import SweepSettings

__all__ = ["available", "check_resources", "trial_needs"]


def trial_needs(settings: SweepSettings) -> dict[str, float]:
    """CPUs and GPUs of one trial's Ray Train workers (a driver
    reserves almost nothing beyond them; a one-worker trial's driver is its worker)."""
    return {
        "CPU": settings.workers * settings.cpus_per_worker,
        "GPU": settings.workers * settings.gpus_per_worker,
    }


def available(address: str | None) -> dict[str, float]:
    """CPUs and GPUs of the local machine, or of the Ray cluster at `address` (a short
    connection: nothing is launched)."""
    if address is None:
        import torch

        return {"CPU": float(os.cpu_count() or 1), "GPU": float(torch.cuda.device_count())}
    import ray

    ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    try:
        resources = ray.cluster_resources()
    finally:
        ray.shutdown()
    return {"CPU": resources.get("CPU", 0.0), "GPU": resources.get("GPU", 0.0)}


def check_resources(settings: SweepSettings) -> None:
    """A ConfigError (one line: what is asked, what exists) when one trial cannot fit: it
    would wait for workers forever."""
    needs, has = trial_needs(settings), available(settings.address)
    where = f"the cluster at {settings.address}" if settings.address else "this machine"
    for kind, flag, per_worker in (
        ("CPU", "--workers", settings.cpus_per_worker),
        ("GPU", "--gpus-per-worker", settings.gpus_per_worker),
    ):
        if needs[kind] > has[kind]:
            raise ConfigError(
                f"{flag}: a trial of {settings.workers} workers x {per_worker:g} {kind} needs "
                f"{needs[kind]:g} {kind}s; {where} has {has[kind]:g}"
            )
