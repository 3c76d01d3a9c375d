"""Checkpoint files written atomically and read defensively.

A checkpoint is a folder holding `state.pt`. It is written under a temporary name and renamed
into place, so a reader never sees half a checkpoint; a file that is truncated or corrupt all
the same (a disk fault, a copy cut short) is detected on load and the previous one is used.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from schedule_search.core.files import as_if_created

__all__ = [
    "PREFIX",
    "STATE_FILE",
    "checkpoint_folders",
    "folder_name",
    "load_latest",
    "load_state",
    "prune",
    "save_state",
]

STATE_FILE = "state.pt"
PREFIX = "checkpoint_"


def save_state(folder: Path, state: dict[str, Any]) -> None:
    """Write `state` into a new checkpoint folder `folder` (atomically, as a whole folder)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        with open(staging / STATE_FILE, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        as_if_created(staging, folder=True)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def load_state(folder: Path) -> dict[str, Any]:
    """Load a checkpoint folder's state; raises ValueError if it is missing or unreadable."""
    path = Path(folder) / STATE_FILE
    try:
        with open(path, "rb") as handle:
            # On the CPU first: a run may resume on another device than it was saved from.
            return torch.load(handle, map_location="cpu", weights_only=False)
    except (OSError, EOFError, RuntimeError, ValueError) as err:
        raise ValueError(f"unreadable checkpoint {path}: {err}") from err
    except Exception as err:  # unpickling garbage raises many kinds of errors
        raise ValueError(f"unreadable checkpoint {path}: {type(err).__name__}: {err}") from err


def checkpoint_folders(root: Path) -> list[Path]:
    """Complete checkpoint folders under `root`, oldest first (names sort by token count)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def load_latest(root: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest readable checkpoint under `root`, skipping (with a warning) corrupt ones."""
    for folder in reversed(checkpoint_folders(root)):
        try:
            return folder, load_state(folder)
        except ValueError as err:
            warnings.warn(f"{err}; falling back to the previous checkpoint", stacklevel=2)
    return None


def prune(root: Path, keep: int) -> None:
    """Keep only the newest `keep` checkpoints under `root`, and remove staging folders that a
    writer killed mid-write left behind (called after a save, when none of ours is open)."""
    for folder in checkpoint_folders(root)[:-keep]:
        shutil.rmtree(folder, ignore_errors=True)
    for staging in root.glob(f".{PREFIX}*"):
        shutil.rmtree(staging, ignore_errors=True)


def folder_name(tokens: int) -> str:
    return f"{PREFIX}{tokens:015d}"
