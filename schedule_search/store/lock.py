"""One driver per experiment: `sweep`, `resume` and `transfer` hold an exclusive lock on
`runs/<name>/.lock` while they run. It is an flock, so the kernel drops it when its process
dies, SIGKILL included: a dead driver never blocks a resume."""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from schedule_search.core.config import ConfigError

__all__ = ["experiment_lock", "lock_holder"]


#: `status` probes the lock with a shared flock for an instant (`lock_holder`): a driver that
#: starts in that instant waits it out rather than be refused.
PROBE_GRACE_S = 0.5


@contextlib.contextmanager
def experiment_lock(root: Path, verb: str) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    path = root / ".lock"
    handle = open(path, "a+")  # noqa: SIM115 - held open for the lock's lifetime
    deadline = time.monotonic() + PROBE_GRACE_S
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() < deadline:
                time.sleep(0.01)
                continue
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise ConfigError(
                f"{root}: already running ({holder}); wait for it to end or stop it first"
            ) from None
    now = datetime.datetime.now().isoformat(timespec="seconds")
    handle.seek(0)
    handle.truncate()
    handle.write(f"`{verb}` by pid {os.getpid()} since {now}")
    handle.flush()
    try:
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def lock_holder(root: Path) -> str | None:
    """Who holds the experiment's lock now (`` `transfer` by pid 7763 since ...``), or None
    when no driver runs: the kernel answers, so a killed driver's stale text is not taken
    for a live one."""
    path = root / ".lock"
    try:
        handle = open(path)  # noqa: SIM115 - closed below, the lock probed while open
    except OSError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return handle.read().strip() or "another process"
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None
