"""The Ray a sweep runs on: a local one it starts (and always shuts down), or a cluster it
connects to, with the environment both need set where Ray starts, never at import.

The local Ray is in Ray's token mode with a fresh random token each time it starts: Ray binds
its GCS, raylets and workers to every interface of the machine (the node address is the
machine's network address; `ray.init` offers no loopback-only mode on Linux), so without a
token anyone who can reach the machine during a sweep could submit code to it. A cluster's
authentication is the cluster's: the user's `RAY_AUTH_MODE` and token are left as they are.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray

from schedule_search.core.interrupts import Interrupted
from schedule_search.store.experiment import SweepSettings
from schedule_search.sweep.failures import TrialsFailed
from schedule_search.tasks.registry import task_code
from schedule_search.train.launch import free_port

__all__ = [
    "AUTH_VARIABLES",
    "DRIVER_ENVIRONMENT",
    "DRIVER_ONLY_ENVIRONMENT",
    "TOKEN_FILE",
    "RayNotStarted",
    "local_token",
    "ray_session",
    "trial_driver_resources",
]


#: Set (unless the user set them) before Ray starts or is connected to. Tune reads the first
#: two; Ray Train's controllers read the next two, and Tune passes them on to its trials, on a
#: cluster too. A snapshot every second so a killed driver forgets as little as possible.
DRIVER_ENVIRONMENT = {
    "TUNE_GLOBAL_CHECKPOINT_S": "1",
    "RAY_AIR_NEW_OUTPUT": "0",  # Tune's classic reporter; the live view is ours
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",  # reports are not delayed by 2 s polls
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_CHDIR_TO_TRIAL_DIR": "0",  # trials keep the driver's working directory
}
#: Set in the driver alone, once Ray runs (its workers do not inherit it, so their logs keep
#: every unhandled error; Ray reads it at each report). The errors the driver would report
#: are those of the tasks Tune abandons: a failed trial's cause is in its record and Tune's
#: error file, and a sweep that ends (a full volume) would print their tracebacks again
#: around the one line the CLI ends with.
DRIVER_ONLY_ENVIRONMENT = {"RAY_IGNORE_UNHANDLED_ERRORS": "1"}
#: The variables Ray reads its authentication from: the mode, then the token itself or the
#: file holding it (Ray's order; the third place is ~/.ray/auth_token).
AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
#: The local Ray's token, in the experiment folder while that Ray runs (mode 0600).
TOKEN_FILE = "ray_token"


@contextlib.contextmanager
def local_token(folder: Path) -> Iterator[Path]:
    """Ray's token mode, with a fresh random token in `folder`/ray_token (mode 0600, never
    printed), for the Ray started inside: every process of that Ray inherits the mode and
    the token's path, and refuses a client without the token. The file is removed and the
    user's own authentication variables are restored afterwards.

    Ray reads the mode and the token once a process (`RayConfig`, the token loader's cache):
    both are reloaded here as Ray's own `_enable_token_auth` does, so a second sweep in the
    same process (a notebook, a test) gets its own token, and a later cluster connection the
    user's. Reloading uses two of Ray's internal calls; the tests start two local Rays in one
    process and fail if they change."""
    path = folder / TOKEN_FILE
    path.unlink(missing_ok=True)  # a killed sweep's token: a new Ray gets a new one
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(secrets.token_urlsafe(32))
    saved = {name: os.environ.get(name) for name in AUTH_VARIABLES}
    os.environ.pop("RAY_AUTH_TOKEN", None)  # it would take precedence over the file
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(path.resolve())
    _reload_authentication()
    try:
        yield path
    finally:
        _put_back(saved)
        _reload_authentication()
        path.unlink(missing_ok=True)


def _reload_authentication() -> None:
    """Make this process read Ray's authentication variables again (see `local_token`)."""
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def _init_ray(settings: SweepSettings, code: Path | None) -> None:
    for name, value in DRIVER_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    if settings.address:
        # A cluster's workers have neither the driver's PYTHONPATH nor its working directory:
        # the user's task module travels with the job.
        ray.init(
            address=settings.address,
            runtime_env={"py_modules": [str(code)]} if code else None,
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
    else:
        _init_local_ray(settings)


#: Local Rays started, each on a newly chosen dashboard port, before giving up.
DASHBOARD_ATTEMPTS = 3


def _init_local_ray(settings: SweepSettings) -> None:
    """A new local Ray; for trials with Ray Train worker groups, one whose dashboard (the
    State API) listens where `_pin_state_api` said.

    The port is free when chosen, but another process may bind it before the dashboard does;
    Ray then logs an error and runs without a dashboard, and a stopped trial's workers would
    never be freed (`_pin_state_api`). Such a Ray (its `dashboard_url` None) is shut down and
    started again on another port. In-process trials start no worker group, so nothing asks
    the State API: their Ray starts without a dashboard (its head and nine module processes
    took 3.6 of a local Ray's 8.4 CPU-s over its first 20 s here, and a second of its start)."""
    options: dict[str, Any] = {
        "address": "local",  # a new Ray of its own, even beside a `ray start` cluster here
        "num_cpus": os.cpu_count(),
        "resources": {"trial_slot": settings.concurrency},
        "logging_level": logging.WARNING,
        "log_to_driver": False,
    }
    if settings.in_process:
        ray.init(**options, include_dashboard=False)
        return
    tried = []
    for _ in range(DASHBOARD_ATTEMPTS):
        port = _pin_state_api()
        tried.append(str(port))
        if ray.init(**options, dashboard_port=port).dashboard_url:
            return
        ray.shutdown()
    raise RuntimeError(
        f"the local Ray's dashboard could bind none of ports {', '.join(tried)} (Ray Train "
        "needs its State API to free a stopped trial's workers)"
    )


def _pin_state_api() -> int:
    """A port for the local Ray's dashboard, named to every process of that Ray.

    Ray Train's placement-group cleaner asks the State API (the dashboard) whether a trial's
    controller is dead, and finds it by auto-detecting "the" local Ray: with a second Ray on
    the machine that lookup raises, the cleaner's thread dies, and a trial stopped early never
    frees its workers (the sweep then waits forever). Naming the API server in the
    environment the local Ray's processes inherit (`RAY_API_SERVER_ADDRESS`, which the
    lookup reads first) keeps each Ray's cleaner on its own Ray.
    """
    port = free_port()
    os.environ["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{port}"
    return port


def trial_driver_resources(settings: SweepSettings) -> dict[str, float]:
    """What a trial's driver reserves: almost nothing when Ray Train workers do the training
    (they reserve their own CPUs), a worker's CPUs when it trains in its own process. Tune
    refuses a trial of no resources: a local Ray is started with `trial_slot` resources (one
    per concurrent trial); a cluster that declares them (`ray start --resources
    '{"trial_slot": K}'`) is used the same way, and on one that does not, a trial's driver
    reserves a hundredth of a CPU."""
    cpus = settings.cpus_per_worker if settings.in_process else 0.0
    if ray.cluster_resources().get("trial_slot", 0) >= 1:
        return {"cpu": cpus, "trial_slot": 1}
    return {"cpu": cpus or 0.01}


@contextlib.contextmanager
def ray_session(settings: SweepSettings, task: dict[str, Any], folder: Path) -> Iterator[None]:
    """A local Ray whose token lies in the experiment `folder` while it runs (or a connection
    to the cluster at `settings.address`, which is sent the code of the user's `task`),
    always shut down; the variables it sets in this process are restored afterwards, also when
    Ray could not start (a later Ray here must not look for this one's State API)."""
    names = ["RAY_API_SERVER_ADDRESS", *DRIVER_ONLY_ENVIRONMENT]
    with contextlib.ExitStack() as stack:
        stack.callback(_put_back, {name: os.environ.get(name) for name in names})
        if not settings.address:
            stack.enter_context(local_token(folder))
        _start_or_say_why(settings, task_code(task))
        stack.callback(ray.shutdown)  # first of all at the end
        os.environ.update(DRIVER_ONLY_ENVIRONMENT)
        yield


class RayNotStarted(TrialsFailed):
    """Ray could not be started (or the cluster joined): no trial can run. `str()` is one
    line: Ray's own reasons (a socket path past the kernel's 107 bytes under a long
    RAY_TMPDIR, a raylet that died at start) come as multi-line tracebacks."""


def _start_or_say_why(settings: SweepSettings, code: Path | None) -> None:
    """`_init_ray`, its failure as `RayNotStarted` (whatever Ray left half started shut down):
    the experiment folder is written by then, and `resume` (for a transfer, `transfer` run
    again) continues it once Ray can start."""
    try:
        _init_ray(settings, code)
    except Interrupted:
        raise
    except Exception as err:
        ray.shutdown()
        what = (
            f"the Ray cluster at {settings.address} could not be joined"
            if settings.address
            else "the local Ray could not start"
        )
        cause = " ".join(str(err).split()) or "no reason given"
        raise RayNotStarted(f"{what}: {type(err).__name__}: {cause}") from err


def _put_back(saved: dict[str, str | None]) -> None:
    """Set each variable of `saved` back to its value there (None: unset)."""
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
