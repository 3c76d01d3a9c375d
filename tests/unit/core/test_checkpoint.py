"""Corrupt checkpoints: a latest one cut short falls back to the one before (and the run
ends where a run never damaged ends); garbage is named, never loaded."""

import errno
import os

import pytest
import torch

from schedule_search.core import checkpoint as ckpt
from schedule_search.core.config import parse
from schedule_search.train.config import TrainConfig
from schedule_search.train.launch import run_local

LINREG_RUN = {
    "task": {"name": "linreg", "dim": 64, "batch": 16},
    "window": {"policy": "microbatches", "microbatches": 2},
    "budget": {"horizon": 2.0, "eval_at": [1.0]},
    "checkpoint": {"every_windows": 10, "keep": 3},
}


def test_corrupt_latest_checkpoint_falls_back_to_the_previous(tmp_path):
    config = parse(TrainConfig, LINREG_RUN, "test")
    straight = run_local(config, tmp_path / "straight")
    run_local(config, tmp_path / "damaged")
    folders = ckpt.checkpoint_folders(tmp_path / "damaged" / "checkpoints")
    assert len(folders) == 3, "only the last `keep` checkpoints stay on disk"
    state = folders[-1] / ckpt.STATE_FILE
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # a copy cut short
    with pytest.warns(UserWarning, match="falling back to the previous checkpoint"):
        resumed = run_local(config, tmp_path / "damaged")

    def losses(history):
        return [{k: v for k, v in row.items() if k.startswith("val_loss")} for row in history]

    assert losses(resumed.history) == losses(straight.history)
    a = ckpt.load_latest(tmp_path / "straight" / "checkpoints")[1]
    b = ckpt.load_latest(tmp_path / "damaged" / "checkpoints")[1]
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_garbage_checkpoint_is_detected(tmp_path):
    folder = tmp_path / "checkpoint_000000000000001"
    folder.mkdir()
    (folder / ckpt.STATE_FILE).write_bytes(os.urandom(1000))
    with pytest.raises(ValueError, match="unreadable checkpoint"):
        ckpt.load_state(folder)
    with pytest.warns(UserWarning):
        assert ckpt.load_latest(tmp_path) is None


class RunsCode:
    """What a crafted checkpoint holds: an object whose unpickling runs a command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_every_checkpoint_a_run_writes_loads_as_tensors_and_plain_containers(tmp_path):
    """Weights, optimizer (AdamW, schedule-free), EMA bank, window (int8 residuals), RNG and
    progress: all of it loads with torch's weights_only unpickler."""
    for optimizer in ("adamw", "schedulefree_adamw"):
        run = {
            **LINREG_RUN,
            "optimizer": {"name": optimizer, "lr": 0.01},
            "window": {"policy": "microbatches", "microbatches": 2, "compression": "int8"},
        }
        run_local(parse(TrainConfig, run, "test"), tmp_path / optimizer)
        for folder in ckpt.checkpoint_folders(tmp_path / optimizer / "checkpoints"):
            torch.load(folder / ckpt.STATE_FILE, weights_only=True)


def test_a_crafted_checkpoint_is_refused_in_one_line_and_runs_nothing(tmp_path):
    config = parse(TrainConfig, LINREG_RUN, "test")
    run_local(config, tmp_path / "run")
    folders = ckpt.checkpoint_folders(tmp_path / "run" / "checkpoints")
    state = torch.load(folders[-1] / ckpt.STATE_FILE, weights_only=True)
    marker = tmp_path / "ran"
    torch.save({**state, "progress": RunsCode(marker)}, folders[-1] / ckpt.STATE_FILE)
    with pytest.raises(ckpt.UnsafeCheckpoint) as refused:
        ckpt.load_state(folders[-1])
    message = str(refused.value)
    assert message.startswith(str(folders[-1] / ckpt.STATE_FILE)) and "\n" not in message
    assert "posix.system" in message
    # Never skipped over for the one before: it is not a disk fault but a file someone wrote.
    with pytest.raises(ckpt.UnsafeCheckpoint):
        ckpt.load_latest(tmp_path / "run" / "checkpoints")
    with pytest.raises(ckpt.UnsafeCheckpoint):
        run_local(config, tmp_path / "run")  # a resume
    assert not marker.exists()


FULL_DISK = """
import errno, json, resource, signal, sys
from pathlib import Path
import torch
from schedule_search.core import checkpoint as ckpt

root = Path(sys.argv[1])
ckpt.save_state(root / "checkpoint_1", {"w": torch.ones(1000)})  # 4 kB: fits
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    ckpt.save_state(root / "checkpoint_2", {"w": torch.ones(1 << 20)})  # 4 MiB: refused
except OSError as err:
    print(json.dumps({"errno": err.errno, "filename": str(err.filename), "message": str(err)}))
"""


def test_a_write_the_kernel_refuses_surfaces_with_its_cause_and_leaves_the_last_checkpoint(
    tmp_path,
):
    """torch.save reports a failed write as "unexpected pos"; save_state raises the write's own
    OSError instead (here EFBIG, from a file-size limit: a real kernel refusal, as ENOSPC from
    a full disk or EROFS from a read-only one), naming the file, and leaves nothing half
    written beside the previous checkpoint."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    refused = json.loads(done.stdout)
    assert refused["errno"] == errno.EFBIG, refused
    assert refused["filename"].endswith(ckpt.STATE_FILE) and str(tmp_path) in refused["filename"]
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint_1"]  # no staging folder left
    assert torch.equal(ckpt.load_state(tmp_path / "checkpoint_1")["w"], torch.ones(1000))
