"""Files that readers never see half-written, and line logs that survive a kill.

Every record a sweep or run leaves (configs, histories, tables, recipes, checkpoints) is
written under a temporary name and renamed into place. Append-only logs (`*.jsonl`) are read
back skipping a last line cut short by a kill.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from schedule_search.core.config import ConfigError

__all__ = [
    "append_jsonl",
    "as_if_created",
    "atomic_write_bytes",
    "atomic_write_text",
    "read_jsonl",
    "require_placeable",
    "strict_json",
]


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: Read once, at import: temporary files are created private (0600, 0700), so what is renamed
#: into place is given the mode an ordinary write would have (teammates on a shared --storage
#: read recipes, tables and plots as the umask allows).
UMASK = _current_umask()


def as_if_created(path: str | Path, folder: bool = False) -> None:
    os.chmod(path, (0o777 if folder else 0o666) & ~UMASK)


@contextlib.contextmanager
def naming(path: str | Path) -> Iterator[None]:
    """Within: an OSError that names no file is given `path`. A failed write, flush, fsync or
    close (a full volume: ENOSPC; a read-only one: EROFS) names none, and the one line a user
    sees should say which file could not be written."""
    try:
        yield
    except OSError as err:
        if err.filename is None:
            err.filename = str(path)
        raise


def require_placeable(path: Path, what: str, folder: bool = False) -> None:
    """Refuse, before any work, a path a file (or with `folder`, a folder) cannot be made at:
    one that exists as the other kind, or lies under a file. Found only at the write, it
    was a traceback after the work (a `train --run-dir` naming a file: after its first
    checkpoint)."""
    if path.exists() and path.is_dir() != folder:
        kind = "a folder" if path.is_dir() else "a file"
        raise ConfigError(f"{what}: {path} is {kind}; expected a {'folder' if folder else 'file'}")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{what}: {path} lies under {parent}, a file")
            return


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with naming(path), os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        as_if_created(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def strict_json(data: Any) -> str:
    """`data` as JSON that every reader parses (jq, a browser, a strict parser), for the
    tables a user reads: a number that is not finite (a run that diverged: inf; a mean over no
    seeds, a trial not yet evaluated: NaN) is written as null. Python's json would write
    `NaN` and `Infinity`, which only Python reads back. Records the package reads back
    itself keep Python's form: there a diverged loss stays distinct from a missing one."""
    return json.dumps(_finite(data), indent=1, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line (the folder is made if needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with naming(path), open(path, "a") as handle:
        handle.write(json.dumps(record) + "\n")


def read_jsonl(
    path: Path, keep: Callable[[dict[str, Any]], bool] = lambda record: True
) -> list[dict[str, Any]]:
    """The records of a JSON-lines log that `keep` accepts; a line cut short by a kill (or any
    line that is not a JSON object) is skipped. A missing file is an empty log."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and keep(record):
            records.append(record)
    return records
