"""Signals to a whole process session: a CLI started with `start_new_session=True` and
everything it started, Ray's workers included.

`os.killpg(driver.pid, ...)` is not enough for that: Ray starts each worker in a process group
of its own (in the driver's session), so a worker outlives a killpg of the driver's group by
the moment it takes to notice its raylet is gone, and can write one more record meanwhile.
Linux only (reads /proc), like the machines the tests run on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path


def session_pids(session: int) -> set[int]:
    """The live (not zombie) processes whose session id is `session`."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended while we looked
            continue
        # After "pid (comm)": state, ppid, pgrp, session, ... (comm may hold spaces).
        state, _, _, sid = stat.rsplit(")", 1)[1].split()[:4]
        if int(sid) == session and state != "Z":
            pids.add(int(entry.name))
    return pids


def signal_session(session: int, number: int) -> set[int]:
    """Send `number` to every process of `session`, again until none in it has been missed (a
    process forked meanwhile gets it too); return the processes signalled."""
    signalled: set[int] = set()
    while missed := session_pids(session) - signalled:
        for pid in missed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, number)
        signalled |= missed
    return signalled


def kill_session(session: int, timeout: float = 30.0) -> None:
    """SIGKILL every process of `session` (what a dead machine takes with it) and wait until
    none is left alive: after this, nothing of it writes another byte."""
    signal_session(session, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while session_pids(session):
        assert time.monotonic() < deadline, f"session {session} outlived SIGKILL"
        time.sleep(0.01)


@contextlib.contextmanager
def frozen(session: int) -> Iterator[None]:
    """Every process of `session` stopped (SIGSTOP) for the block, so files it writes can be
    read at one moment; continued (SIGCONT) after, unless the block killed them."""
    stopped = signal_session(session, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
