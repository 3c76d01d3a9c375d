"""The filesystem Tune keeps a sweep's state on: the local one, with whole-file writes.

Tune snapshots its experiment state (every second here) into a staging folder and copies it
to the experiment folder with pyarrow, which writes the copy in place. A volume that fills
during that copy left a truncated `experiment_state-*.json`, the file a `resume` restores
from, and the sweep could not be resumed once space was freed. Through this filesystem, a
file Tune writes replaces the old one only once it is whole (a temporary file and a rename,
as every record of ours is written): a failed snapshot leaves the previous one.

The copy runs in a background thread, and Tune writes its next snapshot into the staging
folder (in place, `open("w")`, before it checks whether the last copy has finished) while
that copy may still be reading the file: the copy then holds a snapshot cut short, whole as
far as the disk is concerned. Such a copy of the experiment snapshot, which is JSON, is not
written: the previous one stays until the next copy brings the whole one (Tune's last
snapshot, at the sweep's end, is copied once the copy before it has finished). Seen on a
full volume, where the end of a sweep forces a snapshot beside a copy still running.
"""

from __future__ import annotations

import fnmatch
import io
import json
from pathlib import Path
from typing import Any

import pyarrow
import pyarrow.fs as pafs

from schedule_search.core.files import atomic_write_bytes

__all__ = ["WholeFileLocalFileSystem", "tune_filesystem"]

#: The one file Tune rewrites in place in its staging folder (the searcher's and the
#: callbacks' states it replaces by a rename, so a copy reads the old or the new one whole).
SNAPSHOT = "experiment_state-*.json"


def _write_whole(path: Path, data: bytes) -> None:
    """`data` written to `path` by a rename, unless it is an experiment snapshot read while
    Tune was still writing it (not a JSON document): the previous snapshot then stays, and
    the next copy brings this one whole."""
    if fnmatch.fnmatch(path.name, SNAPSHOT):
        try:
            json.loads(data)
        except ValueError:
            return
    atomic_write_bytes(path, data)


class _WrittenOnClose(io.BytesIO):
    """What pyarrow writes, held until it closes the stream, then written whole. A stream
    dropped unclosed (a copy given up midway) writes nothing; a writer that closes a stream
    after its own failed write (a `with` block left by an exception) still writes what it
    held, which this class cannot tell from a whole file (but for the experiment snapshot,
    which it parses)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._path = Path(path)

    def close(self) -> None:
        if self.closed:
            return
        data = self.getvalue()
        super().close()
        _write_whole(self._path, data)

    def __del__(self) -> None:
        # Dropped without being closed (a copy given up midway): nothing is written. Without
        # this, `io.IOBase` would close it here, and write what it holds as if whole.
        super().close()


class WholeFileLocalFileSystem(pafs.FileSystemHandler):
    """pyarrow's local filesystem, except that output streams write whole files."""

    def __init__(self) -> None:
        self._local = pafs.LocalFileSystem()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WholeFileLocalFileSystem)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(type(self))

    def get_type_name(self) -> str:
        return "whole-file-local"

    def normalize_path(self, path: str) -> str:
        return self._local.normalize_path(path)

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self._local.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return self._local.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self._local.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self._local.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self._local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise OSError("refusing to delete the contents of the root folder")

    def delete_file(self, path: str) -> None:
        self._local.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self._local.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        with self._local.open_input_stream(src) as source:
            _write_whole(Path(dest), source.read())

    def open_input_stream(self, path: str) -> Any:
        return self._local.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        return self._local.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        return pyarrow.PythonFile(_WrittenOnClose(path), mode="w")

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        return self._local.open_append_stream(path)


def tune_filesystem() -> pafs.FileSystem:
    """The `storage_filesystem` for Tune's runs and restores."""
    return pafs.PyFileSystem(WholeFileLocalFileSystem())
