"""Tune's storage filesystem: a copy the kernel refuses midway leaves the previous file whole
(pyarrow's local filesystem leaves it cut short), a stream dropped unclosed writes nothing,
and the filesystem travels by pickle as Tune sends it to its trials."""

import gc
import json
import pickle
import subprocess
import sys

import pyarrow.fs as pafs

from schedule_search.sweep.tune_storage import tune_filesystem

#: Copy a 1 MB snapshot over a 3-byte one under a 64 kB file-size limit (EFBIG, as ENOSPC from
#: a full volume), through the filesystem named by argv[2]; print what the target then holds.
REFUSED_COPY = """
import resource, signal, sys
from pathlib import Path
import pyarrow.fs as pafs
from schedule_search.sweep.tune_storage import tune_filesystem

folder = Path(sys.argv[1])
(folder / "staged").mkdir()
(folder / "staged" / "experiment_state.json").write_bytes(b"x" * (1 << 20))
(folder / "experiment_state.json").write_bytes(b"old")
filesystem = tune_filesystem() if sys.argv[2] == "whole-file" else pafs.LocalFileSystem()
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:  # pyarrow raises for its own filesystem; it drops the error a Python stream's close raises
    pafs.copy_files(str(folder / "staged"), str(folder), destination_filesystem=filesystem)
except OSError:
    pass
print(len((folder / "experiment_state.json").read_bytes()))
"""


def refused_copy(folder, filesystem: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", REFUSED_COPY, str(folder), filesystem],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout)


def test_a_refused_copy_keeps_the_previous_file_whole(tmp_path):
    (tmp_path / "local").mkdir()
    (tmp_path / "whole").mkdir()
    assert refused_copy(tmp_path / "local", "local") == 1 << 16  # in place: cut short
    assert refused_copy(tmp_path / "whole", "whole-file") == 3  # the previous snapshot
    names = sorted(p.name for p in (tmp_path / "whole").iterdir())
    assert names == ["experiment_state.json", "staged"]  # no temporary file left


def test_a_copy_lands_whole_and_the_filesystem_pickles(tmp_path):
    staged = tmp_path / "staged"
    (staged / "trial").mkdir(parents=True)
    (staged / "trial" / "result.json").write_text('{"loss": 1}')
    filesystem = pickle.loads(pickle.dumps(tune_filesystem()))
    assert filesystem.equals(tune_filesystem())
    pafs.copy_files(str(staged), str(tmp_path / "storage"), destination_filesystem=filesystem)
    assert (tmp_path / "storage" / "trial" / "result.json").read_text() == '{"loss": 1}'
    (info,) = filesystem.get_file_info(pafs.FileSelector(str(tmp_path / "storage" / "trial")))
    assert info.base_name == "result.json" and info.size == 11


def test_a_stream_dropped_before_it_is_closed_writes_nothing(tmp_path):
    """A copy given up midway drops its stream unclosed: what it held is not a whole file."""
    filesystem = tune_filesystem()
    (tmp_path / "state.json").write_bytes(b"old")
    dropped = filesystem.open_output_stream(str(tmp_path / "state.json"))
    dropped.write(b"half")
    del dropped
    gc.collect()
    assert (tmp_path / "state.json").read_bytes() == b"old"
    closed = filesystem.open_output_stream(str(tmp_path / "state.json"))
    closed.write(b"whole")
    closed.close()
    assert (tmp_path / "state.json").read_bytes() == b"whole"


def test_a_snapshot_copied_while_tune_rewrites_it_keeps_the_previous_one(tmp_path):
    """Tune rewrites its experiment snapshot in place in the staging folder while its
    background copy may be reading it: a copy that read it cut short (or just emptied by the
    `open("w")`) is not written; the whole one is, at the next copy. Only the snapshot is
    parsed: other files land as read."""
    staged, storage = tmp_path / "staged", tmp_path / "storage"
    staged.mkdir()
    name = "experiment_state-2026-12-07_03-07-37.json"
    whole = json.dumps({"trial_data": [["{}", "{}"]], "runner_data": {"x": 1}}).encode()
    filesystem = tune_filesystem()

    def copy(content: bytes) -> bytes:
        (staged / name).write_bytes(content)
        (staged / "result.json").write_bytes(content)
        pafs.copy_files(str(staged), str(storage), destination_filesystem=filesystem)
        assert (storage / "result.json").read_bytes() == content
        return (storage / name).read_bytes()

    assert copy(whole) == whole
    for torn in (whole[: len(whole) // 2], b""):
        assert copy(torn) == whole
    newer = json.dumps({"trial_data": [], "runner_data": {"x": 2}}).encode()
    assert copy(newer) == newer
    filesystem.copy_file(str(staged / name), str(storage / "copied.json"))  # in one filesystem
    (staged / name).write_bytes(b'{"trial_data": [')
    filesystem.copy_file(str(staged / name), str(storage / name))
    assert (storage / name).read_bytes() == newer
    assert sorted(p.name for p in storage.iterdir()) == ["copied.json", name, "result.json"]
