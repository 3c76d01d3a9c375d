"""What one trial asks of Ray, checked against what the machine or cluster has before a sweep or
transfer launches: Ray would otherwise keep the trial pending forever ("1 running, 1 waiting")
without a word. A cluster that autoscales is checked against what it has now."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import tempfile
from collections.abc import Iterator

from schedule_search.core.config import ConfigError
from schedule_search.store.experiment import SweepSettings

__all__ = ["available", "check_resources", "default_concurrency", "trial_needs"]


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
    _check_listening(address)
    import ray

    try:
        with _native_stderr_dropped():
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    except (ray.exceptions.AuthenticationError, ConnectionError) as err:
        raise ConfigError(_refused(address, err)) from None
    try:
        resources = ray.cluster_resources()
    finally:
        ray.shutdown()
    return {"CPU": resources.get("CPU", 0.0), "GPU": resources.get("GPU", 0.0)}


#: Seconds to wait for a cluster head's port to accept a connection.
CONNECT_TIMEOUT_S = 5.0


def _check_listening(address: str) -> None:
    """A ConfigError at once where nothing accepts a connection at a `host:port` address (a
    typo, a wrong port, a head that is down): Ray's client would retry its GCS for its whole
    connect window first (824 s here with Ray's defaults) before the same refusal. `auto`, a
    `ray://` address and anything else that is not a host and a port are left to Ray."""
    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise ConfigError(
            f"--address {address}: nothing accepts a connection there "
            f"({err.strerror or err.__class__.__name__}); is a Ray cluster's head running at "
            "that address and port?"
        ) from None


@contextlib.contextmanager
def _native_stderr_dropped() -> Iterator[None]:
    """Within: what Ray's C++ core writes to the process's stderr is dropped. A refused
    connection retries for ~20 s and logs a warning line each time, around the one line the
    CLI prints; Python's logging does not reach those lines."""
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _refused(address: str, err: Exception) -> str:
    """One line for a cluster that listens (`_check_listening`) but did not let this client
    join: the cause as Ray names it (its first sentence, whole: the address Ray tried has dots
    of its own), and what Ray reads a token from (it sends one only in its own token mode)."""
    cause = re.split(r"\.\s|\n", str(err).strip(), maxsplit=1)[0].rstrip(".")
    mode = os.environ.get("RAY_AUTH_MODE") or "unset"
    return (
        f"--address {address}: the cluster there did not let this client join "
        f"({cause or err.__class__.__name__}); RAY_AUTH_MODE is {mode}: a cluster in token "
        "mode needs RAY_AUTH_MODE=token and its token in "
        "RAY_AUTH_TOKEN, the file RAY_AUTH_TOKEN_PATH names, or ~/.ray/auth_token"
    )


def default_concurrency(settings: SweepSettings, has: dict[str, float]) -> int:
    """Trials at once where `--concurrency` is not given: as many as the CPUs (and, for GPU
    workers, the GPUs) that `has` counts hold, at least one. On a cluster `has` is the
    cluster's, not the machine the CLI runs on (a laptop or a small head node)."""
    needs = trial_needs(settings)
    fits = [has[kind] // needs[kind] for kind in ("CPU", "GPU") if needs[kind] > 0]
    return max(1, int(min(fits)))


def check_resources(settings: SweepSettings, has: dict[str, float] | None = None) -> None:
    """A ConfigError (one line: what is asked, what exists) when one trial cannot fit: it
    would wait for workers forever. `has`: what `available` found, if already asked."""
    needs = trial_needs(settings)
    has = has if has is not None else available(settings.address)
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
