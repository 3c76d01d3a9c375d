"""Corrupt checkpoints: a latest one cut short falls back to the one before (and the run
ends where a run never damaged ends); garbage is named, never loaded."""

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
