"""What one trial asks of Ray, checked against what the machine or cluster has before a sweep or
transfer launches: Ray would otherwise keep the trial pending forever ("1 running, 1 waiting")
without a word. A cluster that autoscales is checked against what it has now."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from schedule_search.config import ConfigError
from schedule_search.experiment import SweepSettings


def trial_needs(settings: SweepSettings) -> dict[str, float]:
    """CPUs and GPUs of one trial's Ray Train workers (its driver reserves almost nothing)."""
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

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        resources = ray.cluster_resources()
    finally:
        ray.shutdown()
    return {"CPU": resources.get("CPU", 0.0), "GPU": resources.get("GPU", 0.0)}


def running_local_rays(grace_s: float = 10.0) -> list[str]:
    """GCS addresses of Ray instances already running on this machine (one that is shutting
    down gets `grace_s` to go)."""
    from ray._private.services import find_gcs_addresses  # what `ray.init()` itself asks

    deadline = time.monotonic() + grace_s
    while (found := sorted(find_gcs_addresses())) and time.monotonic() < deadline:
        time.sleep(0.5)
    return found


def check_resources(settings: SweepSettings) -> None:
    """A ConfigError (one line: what is asked, what exists) when one trial cannot fit, or
    when a local run would start a second Ray on this machine: Ray Train's placement-group
    cleaner then cannot tell the two apart, a finished trial's workers are never freed and
    the next trial waits forever (seen with a sweep beside a transfer)."""
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
    if settings.address is None and (others := running_local_rays()):
        raise ConfigError(
            f"another Ray is running on this machine ({others[0]}); two local Rays hang Ray "
            f"Train: run on it with --address {others[0]}, or stop it "
            f"(`{Path(sys.executable).parent / 'ray'} stop`)"
        )
