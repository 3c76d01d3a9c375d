"""Training runs SIGKILLed for real (no Ray): after a checkpoint, a resume is bit-identical
to a run never killed; during a checkpoint's write, the half-written folder is cleared and
the run resumes from the one before."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers import write_config

from schedule_search.core import checkpoint as ckpt


def final_state(run_dir: Path) -> dict:
    found = ckpt.load_latest(run_dir / "checkpoints")
    assert found is not None
    return found[1]


def assert_states_identical(a: dict, b: dict) -> None:
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for frac, tensors in a["ema"]["averages"].items():
        for x, y in zip(tensors, b["ema"]["averages"][frac], strict=True):
            assert torch.equal(x, y), f"ema {frac}"
    for index, slot in a["optimizer"]["state"].items():
        for name, value in slot.items():
            assert torch.equal(
                torch.as_tensor(value), torch.as_tensor(b["optimizer"]["state"][index][name])
            )
    losses = [
        {k: v for k, v in row.items() if k.startswith("val_loss")}
        for row in a["progress"]["history"]
    ]
    other = [
        {k: v for k, v in row.items() if k.startswith("val_loss")}
        for row in b["progress"]["history"]
    ]
    assert losses == other
    assert a["window"] == b["window"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.cost(20)
def test_sigkill_after_checkpoint_then_resume_is_bit_identical(tmp_path):
    cfg = {
        "task": {"name": "linreg", "dim": 512, "batch": 64},
        "window": {"policy": "microbatches", "microbatches": 3},
        "budget": {"horizon": 3.0, "eval_at": [1, 2]},
        "checkpoint": {"every_windows": 5, "keep": 3},
        "ema": {"fractions": [0.0, 0.04, 0.16], "objective": 0.04},
    }
    path = write_config(tmp_path / "run.yaml", cfg)
    command = [sys.executable, "-m", "schedule_search.cli", "train", str(path), "--workers", "2"]

    subprocess.run([*command, "--run-dir", str(tmp_path / "straight")], check=True, timeout=240)

    killed = tmp_path / "killed"
    process = subprocess.Popen([*command, "--run-dir", str(killed)], start_new_session=True)
    deadline = time.monotonic() + 120
    while len(ckpt.checkpoint_folders(killed / "checkpoints")) < 2:
        assert process.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGKILL)  # the launcher and both workers
    process.wait()
    interrupted = final_state(killed)
    assert interrupted["progress"]["status"] == "running", "the kill must land mid-run"
    assert interrupted["window"]["tokens_seen"] > 0

    subprocess.run([*command, "--run-dir", str(killed)], check=True, timeout=240)
    resumed, straight = final_state(killed), final_state(tmp_path / "straight")
    assert resumed["progress"]["status"] == "completed"
    assert_states_identical(resumed, straight)
    windows = [
        json.loads(line)["index"] for line in (killed / "windows.jsonl").read_text().splitlines()
    ]
    assert windows == list(range(len(windows))), "the window log has no gaps or repeats"


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.cost(10)
def test_sigkill_while_a_checkpoint_is_being_written(tmp_path):
    config = {
        "task": {"name": "linreg", "dim": 400_000, "batch": 1},  # ~10 MB of state to write
        # 200 windows: a checkpoint every 40, so four writes to catch after the first
        # complete one, and a resume of seconds.
        "budget": {"horizon": 0.000025, "eval_at": []},
        "checkpoint": {"every_windows": 40, "keep": 2},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))

    def kill_mid_write(run_dir: Path) -> bool:
        """Start a run, SIGKILL it once a checkpoint's staging folder exists (a write under
        way, after one complete checkpoint); True if the kill landed before the write ended,
        False if it landed after, or if the run ended with no write caught."""
        process = subprocess.Popen(
            [*command, "--run-dir", str(run_dir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        checkpoints = run_dir / "checkpoints"
        deadline = time.monotonic() + 200
        complete = False  # a complete checkpoint exists: the write after it can be caught
        while True:
            if process.poll() is not None:
                assert process.returncode == 0, f"the run failed: exit {process.returncode}"
                return False
            assert time.monotonic() < deadline, "no write to interrupt"
            if not complete:
                # No moment before the first checkpoint is complete (40 windows after it the next
                # write starts): a look every 20 ms until then leaves the run its core.
                complete = bool(ckpt.checkpoint_folders(checkpoints))
                if not complete:
                    time.sleep(0.02)
                    continue
            staging = list(checkpoints.glob(f".{ckpt.PREFIX}*")) if checkpoints.exists() else []
            if staging and ckpt.checkpoint_folders(checkpoints):
                break
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return bool(list(checkpoints.glob(f".{ckpt.PREFIX}*")))

    command = [sys.executable, "-m", "schedule_search.cli", "train", str(tmp_path / "run.yaml")]
    # The write takes milliseconds: a kill that arrives just after it finished, or a run that
    # ends with every write missed, is retried (on a loaded machine the poll above is
    # scheduled less often and misses more writes).
    attempts = 20
    for attempt in range(attempts):
        run_dir = tmp_path / f"run{attempt}"
        if kill_mid_write(run_dir):
            break
    else:
        pytest.fail(f"no kill landed during a checkpoint write in {attempts} attempts")
    checkpoints = run_dir / "checkpoints"
    newest_tokens = int(ckpt.checkpoint_folders(checkpoints)[-1].name.removeprefix(ckpt.PREFIX))

    subprocess.run(
        [*command, "--run-dir", str(run_dir)], check=True, capture_output=True, timeout=200
    )
    events = [json.loads(x) for x in (run_dir / "events.jsonl").open()]
    assert events[0]["event"] == "resumed" and events[0]["tokens"] == newest_tokens
    assert ckpt.load_latest(checkpoints)[1]["progress"]["status"] == "completed"
    assert not list(checkpoints.glob(f".{ckpt.PREFIX}*")), "the half-written folder is cleared"
