"""Checkpoint files written atomically and read defensively.

A checkpoint is a folder holding `state.pt`. It is written under a temporary name and renamed
into place, so a reader never sees half a checkpoint; a file that is truncated or corrupt all
the same (a disk fault, a copy cut short) is detected on load and the previous one is used.

A checkpoint holds tensors and plain containers only (RNG states as tensors, progress as plain
types) and is read with `torch.load(weights_only=True)`: a run folder or a packed study from
someone else cannot run code when it is resumed. A file holding any other pickled object is
refused (`UnsafeCheckpoint`), never used and never skipped over for an older one: it is not a
disk fault but a file that someone wrote.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, TypeVar, cast

import torch

from schedule_search.core.config import ConfigError
from schedule_search.core.files import as_if_created, naming

__all__ = [
    "PREFIX",
    "STATE_FILE",
    "UnsafeCheckpoint",
    "checkpoint_folders",
    "folder_name",
    "load_latest",
    "load_state",
    "prune",
    "save_state",
]

STATE_FILE = "state.pt"
PREFIX = "checkpoint_"


class UnsafeCheckpoint(ConfigError):
    """A checkpoint file holding a pickled object other than tensors and plain containers: a
    bad input, refused in one line (the CLI's exit code 2)."""


def save_state(folder: Path, state: dict[str, Any]) -> None:
    """Write `state` into a new checkpoint folder `folder` (atomically, as a whole folder)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        with naming(staging / STATE_FILE), open(staging / STATE_FILE, "wb") as handle:
            writes = _KeepsWriteError(handle)
            try:
                torch.save(state, cast(BinaryIO, writes))  # torch.save calls write() and flush()
            except RuntimeError:
                if writes.error is None:
                    raise
                raise writes.error from None  # the cause, not torch's "unexpected pos"
            handle.flush()
            os.fsync(handle.fileno())
        as_if_created(staging, folder=True)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


_T = TypeVar("_T")


class _KeepsWriteError:
    """The file torch.save writes through, keeping the OSError a write raised. torch's zip
    writer turns a failed write into "unexpected pos" (a RuntimeError), which hides the cause
    (a full disk: ENOSPC; a read-only one: EROFS); `save_state` raises the OSError instead,
    named after the file it could not write."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        return self._keeping(self.handle.write, data)

    def flush(self) -> None:
        self._keeping(self.handle.flush)

    def _keeping(self, call: Callable[..., _T], *args: Any) -> _T:
        try:
            return call(*args)
        except OSError as err:
            self.error = err
            raise


def load_state(folder: Path) -> dict[str, Any]:
    """Load a checkpoint folder's state; raises ValueError if it is missing or unreadable."""
    path = Path(folder) / STATE_FILE
    try:
        with open(path, "rb") as handle:
            # On the CPU first: a run may resume on another device than it was saved from.
            return torch.load(handle, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        # torch's weights-only unpickler names the global it would not import: an object a
        # writer put there. Anything else it cannot read is damage, as below.
        refused = [line.strip().rstrip(".") for line in str(err).splitlines() if "GLOBAL" in line]
        if not refused:
            raise ValueError(f"unreadable checkpoint {path}: {err}") from err
        raise UnsafeCheckpoint(
            f"{path}: refused, it holds a pickled object that loading could run as code "
            f"({refused[0]}); checkpoints hold tensors and plain containers only"
        ) from None
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
    """The newest readable checkpoint under `root`, skipping (with a warning) corrupt ones; an
    unsafe one stops the search (`UnsafeCheckpoint`)."""
    for folder in reversed(checkpoint_folders(root)):
        try:
            return folder, load_state(folder)
        except UnsafeCheckpoint:
            raise
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
