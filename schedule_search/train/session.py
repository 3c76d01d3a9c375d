"""Where a run's results go and which rank it is: the `Session` the loop talks to, and
`LocalSession` for a plain or torch.distributed run (the Ray Train one lives with the sweep).
Also the run's own logs: `events.jsonl` (resumes, branches) and `windows.jsonl` (a line per
window)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from schedule_search.core import checkpoint as ckpt
from schedule_search.core.files import append_jsonl, atomic_write_text, read_jsonl
from schedule_search.core.window import WindowRecord

__all__ = ["LocalSession", "Session", "WindowLog", "log_event"]


class Session(Protocol):
    """Where a run's results go. `report` is called on every rank at every evaluation point
    (a barrier under Ray Train); only rank 0's `state` is stored."""

    rank: int
    world_size: int
    log_dir: Path

    def device(self) -> torch.device: ...

    def latest_state(self) -> dict[str, Any] | None: ...

    def report(self, metrics: dict[str, Any], state: dict[str, Any] | None) -> None: ...

    def save(self, state: dict[str, Any]) -> None: ...


def log_event(session: Session, event: dict[str, Any]) -> None:
    """Rank 0 appends run events (resumes, branches) to `events.jsonl`: an audit trail of
    where each start of the run began."""
    if session.rank == 0:
        append_jsonl(session.log_dir / "events.jsonl", event)


class WindowLog:
    """Rank 0 appends one JSON line per window to `windows.jsonl`; on resume, records past the
    checkpoint (which the resumed run will redo) are dropped first."""

    def __init__(self, session: Session, resumed_windows: int) -> None:
        self.path = session.log_dir / "windows.jsonl" if session.rank == 0 else None
        if self.path is None or not self.path.exists():
            return
        kept = read_jsonl(self.path, lambda record: _index(record) < resumed_windows)
        atomic_write_text(self.path, "".join(json.dumps(record) + "\n" for record in kept))

    def write(self, record: WindowRecord) -> None:
        if self.path is not None:
            append_jsonl(self.path, record.to_dict())


def _index(record: dict[str, Any]) -> float:
    try:
        return int(record["index"])
    except (KeyError, TypeError, ValueError):
        return float("inf")  # not a window record: dropped


class LocalSession:
    """A run outside Ray: metrics and checkpoints under `run_dir` (checkpoints in
    `checkpoints`, `run_dir/checkpoints` by default), rank from torch.distributed."""

    def __init__(self, run_dir: str | Path, keep: int = 2, checkpoints: Path | None = None) -> None:
        self.log_dir = Path(run_dir).resolve()
        self.checkpoints = checkpoints or self.log_dir / "checkpoints"
        self.keep = keep
        initialized = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if initialized else 0
        self.world_size = dist.get_world_size() if initialized else 1

    def device(self) -> torch.device:
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", self.rank)))
        return torch.device("cpu")

    def latest_state(self) -> dict[str, Any] | None:
        found = ckpt.load_latest(self.checkpoints)
        return None if found is None else found[1]

    def report(self, metrics: dict[str, Any], state: dict[str, Any] | None) -> None:
        if state is None:  # a resumed run that had already ended: its history is on disk
            return
        self.save(state)
        if self.rank == 0:
            history = state["progress"]["history"]
            atomic_write_text(self.log_dir / "metrics.json", json.dumps(history, indent=1))

    def save(self, state: dict[str, Any]) -> None:
        if self.rank == 0:
            ckpt.save_state(
                self.checkpoints / ckpt.folder_name(state["window"]["tokens_seen"]), state
            )
            ckpt.prune(self.checkpoints, self.keep)
        if self.world_size > 1:
            dist.barrier()
