"""Which trial failures end a sweep at once: a write refused inside the experiment folder by a
full or read-only volume (each retry would meet it again), and no other."""

import errno
import os
from pathlib import Path

import pytest

from schedule_search.sweep.failures import unwritable_path

FOLDER = Path("/data/runs/lin")


def line(number: int, path: Path) -> str:
    """The exception line Tune's error file holds for an OSError of `number` at `path`."""
    return f"OSError: {OSError(number, os.strerror(number), str(path))}"


@pytest.mark.parametrize("number", [errno.ENOSPC, errno.EDQUOT, errno.EROFS])
def test_a_full_or_read_only_volume_inside_the_folder_ends_the_sweep(number):
    assert unwritable_path(line(number, FOLDER / "trials" / "t1" / "metrics.json"), FOLDER)
    assert unwritable_path(line(number, FOLDER / "train" / "run-1" / "state.pt"), FOLDER)


def test_other_failures_are_retried():
    # The same volume errors on another disk (a worker's staging folder, a node's /tmp): a
    # retry may run where there is room.
    assert not unwritable_path(line(errno.ENOSPC, Path("/tmp/ray/staging/state.pt")), FOLDER)
    assert not unwritable_path(line(errno.ENOSPC, Path("/data/runs/lin2/x.json")), FOLDER)
    # Other errors inside the folder, and errors that name no path.
    assert not unwritable_path(line(errno.EACCES, FOLDER / "trials" / "t1" / "x.json"), FOLDER)
    assert not unwritable_path("RuntimeError: [Errno 28] No space left on device", FOLDER)
    assert not unwritable_path("ValueError: loss is nan", FOLDER)
