"""Faults injected for real: a held lock, corrupt checkpoints, a diverging trial, a SIGKILLed
Ray Train worker; and fuzzed inputs that must never reach the user as a traceback."""

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

from schedule_search import checkpoint as ckpt
from schedule_search.cli import main
from schedule_search.config import parse
from schedule_search.experiment import Experiment, SweepSettings
from schedule_search.launch import run_local
from schedule_search.lock import experiment_lock
from schedule_search.train import TrainConfig

LINREG_RUN = {
    "task": {"name": "linreg", "dim": 64, "batch": 16},
    "window": {"policy": "microbatches", "microbatches": 2},
    "budget": {"horizon": 2.0, "eval_at": [1.0]},
    "checkpoint": {"every_windows": 10, "keep": 3},
}


def test_a_second_driver_is_refused_and_a_dead_one_holds_nothing(tmp_path, capsys):
    experiment = Experiment(tmp_path / "runs" / "x")
    experiment.root.mkdir(parents=True)
    experiment.save_settings(SweepSettings("x", "space.yaml", 1, 1, 1, 0))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path\n"
            "from schedule_search.lock import experiment_lock\n"
            f"with experiment_lock(Path({str(experiment.root)!r}), 'sweep'):\n"
            "    print('held', flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    assert main(["resume", "x", "--storage", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "already running (`sweep` by pid" in err and err.count("\n") == 1
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with experiment_lock(experiment.root, "resume"):  # the kernel released the dead holder's lock
        pass


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


def write_space(path: Path, space: dict) -> Path:
    path.write_text(yaml.safe_dump(space))
    return path


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_diverging_trial_ends_as_diverged_and_the_sweep_goes_on(tmp_path):
    space = {
        "name": "div",
        "samples": 2,
        "seed": 0,
        "base": {
            "task": {"name": "linreg", "dim": 64, "batch": 16},
            "optimizer": {"name": "sgd", "lr": 0.05},
            "window": {"microbatches": 1, "clip_norm": None},
            "budget": {"horizon": 1.0, "eval_at": [0.5]},
        },
        "params": {"optimizer.lr": {"type": "loguniform", "low": 0.01, "high": 1000.0}},
        "points_to_evaluate": [{"optimizer.lr": 1000.0}, {"optimizer.lr": 0.05}],
    }
    path = write_space(tmp_path / "space.yaml", space)
    storage = str(tmp_path / "runs")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "schedule_search.cli",
            "sweep",
            str(path),
            "--storage",
            storage,
            "--workers",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=350,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r.params["optimizer.lr"]: r for r in Experiment(tmp_path / "runs" / "div").rows(1.0)}
    assert rows[1000.0].state == "diverged" and "non-finite" in rows[1000.0].reason
    assert rows[0.05].state == "completed"
    assert "diverged" in done.stdout  # the status table shows it
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    study = optuna.load_study(
        study_name="div",
        storage=JournalStorage(
            JournalFileBackend(str(tmp_path / "runs" / "div" / "optuna.journal"))
        ),
    )
    # The diverged trial is the worst result the searcher can learn from (COMPLETE, infinite
    # loss), not a FAIL that samplers ignore; the live searcher is told the same.
    told = {t.user_attrs["state"]: (t.state.name, t.value) for t in study.trials}
    assert told["diverged"] == ("COMPLETE", float("inf"))
    assert told["completed"][0] == "COMPLETE" and told["completed"][1] < 1e3


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_a_killed_ray_train_worker_restarts_from_the_checkpoint_exactly(tmp_path):
    space = {
        "name": "w",
        "samples": 1,
        "seed": 0,
        "base": {
            "task": {"name": "linreg", "dim": 256, "batch": 16},
            "window": {"policy": "microbatches", "microbatches": 2},
            "budget": {"horizon": 12.0, "eval_at": [float(m) for m in range(1, 12)]},
        },
        "params": {"optimizer.lr": {"type": "loguniform", "low": 0.001, "high": 0.01}},
        "points_to_evaluate": [{"optimizer.lr": 0.003}],
    }
    path = write_space(tmp_path / "space.yaml", space)
    command = [sys.executable, "-m", "schedule_search.cli", "sweep", str(path), "--workers", "2"]
    # The reference: the same sweep, never killed.
    subprocess.run([*command, "--storage", str(tmp_path / "a")], check=True, capture_output=True)

    sweep = subprocess.Popen(
        [*command, "--storage", str(tmp_path / "b")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    experiment = Experiment(tmp_path / "b" / "w")
    deadline = time.monotonic() + 300
    while True:
        assert sweep.poll() is None and time.monotonic() < deadline, "no moment to kill a worker"
        ids = experiment.trial_ids() if experiment.root.exists() else []
        history = experiment.read_trial_json(ids[0], "metrics.json") if ids else None
        uploaded = ids and ckpt.checkpoint_folders(experiment.train_run_dir(ids[0]))
        if history and len(history) >= 2 and uploaded:
            break
        time.sleep(0.05)
    # Ray Train registers an uploaded checkpoint at its next poll (every 0.5 s here); a kill
    # before that restarts from scratch, correctly, and the test would show nothing.
    time.sleep(1.0)
    assert sweep.poll() is None, "the trial ended before a worker could be killed"
    workers = subprocess.run(["pgrep", "-f", "ray::RayTrainWorker"], capture_output=True, text=True)
    pids = [int(p) for p in workers.stdout.split()]
    assert len(pids) == 2
    os.kill(pids[-1], signal.SIGKILL)
    assert sweep.wait(timeout=300) == 0

    straight = Experiment(tmp_path / "a" / "w")
    a = ckpt.load_latest(straight.train_run_dir(straight.trial_ids()[0]))[1]
    b = ckpt.load_latest(experiment.train_run_dir(experiment.trial_ids()[0]))[1]
    assert b["progress"]["status"] == "completed"
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    trial = experiment.trial_ids()[0]
    events = [json.loads(x) for x in (experiment.trial_dir(trial) / "events.jsonl").open()]
    assert any(e["event"] == "resumed" and e["tokens"] > 0 for e in events)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigkill_while_a_checkpoint_is_being_written(tmp_path):
    config = {
        "task": {"name": "linreg", "dim": 400_000, "batch": 1},  # ~10 MB of state to write
        "budget": {"horizon": 0.0002, "eval_at": []},
        "checkpoint": {"every_windows": 40, "keep": 2},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))

    def kill_mid_write(run_dir: Path) -> bool:
        """Start a run, SIGKILL it once a checkpoint's staging folder exists (a write under
        way, after one complete checkpoint); True if the kill landed before the write ended."""
        process = subprocess.Popen(
            [*command, "--run-dir", str(run_dir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        checkpoints = run_dir / "checkpoints"
        deadline = time.monotonic() + 200
        while True:
            assert process.poll() is None and time.monotonic() < deadline, "no write to interrupt"
            staging = list(checkpoints.glob(f".{ckpt.PREFIX}*")) if checkpoints.exists() else []
            if staging and ckpt.checkpoint_folders(checkpoints):
                break
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return bool(list(checkpoints.glob(f".{ckpt.PREFIX}*")))

    command = [sys.executable, "-m", "schedule_search.cli", "train", str(tmp_path / "run.yaml")]
    # The write takes milliseconds: a kill that arrives just after it finished is retried.
    for attempt in range(5):
        run_dir = tmp_path / f"run{attempt}"
        if kill_mid_write(run_dir):
            break
    else:
        pytest.fail("no kill landed during a checkpoint write in 5 attempts")
    checkpoints = run_dir / "checkpoints"
    newest_tokens = int(ckpt.checkpoint_folders(checkpoints)[-1].name.removeprefix(ckpt.PREFIX))

    subprocess.run(
        [*command, "--run-dir", str(run_dir)], check=True, capture_output=True, timeout=200
    )
    events = [json.loads(x) for x in (run_dir / "events.jsonl").open()]
    assert events[0]["event"] == "resumed" and events[0]["tokens"] == newest_tokens
    assert ckpt.load_latest(checkpoints)[1]["progress"]["status"] == "completed"
    assert not list(checkpoints.glob(f".{ckpt.PREFIX}*")), "the half-written folder is cleared"


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sweep_driver_killed_while_a_worker_writes_a_checkpoint(tmp_path):
    space = {
        "name": "c",
        "samples": 1,
        "seed": 0,
        "base": {
            "task": {"name": "linreg", "dim": 200_000, "batch": 1},  # ~5 MB of state
            "budget": {"horizon": 0.0002, "eval_at": [0.00005, 0.0001, 0.00015]},
        },
        "params": {"optimizer.lr": {"type": "loguniform", "low": 0.001, "high": 0.01}},
        "points_to_evaluate": [{"optimizer.lr": 0.003}],
    }
    path = write_space(tmp_path / "space.yaml", space)
    storage = str(tmp_path / "runs")
    driver = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "schedule_search.cli",
            "sweep",
            str(path),
            "--storage",
            storage,
            "--workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    experiment = Experiment(tmp_path / "runs" / "c")
    deadline = time.monotonic() + 300
    while True:  # a checkpoint is being written (staged in the trial's folder, then uploaded)
        assert driver.poll() is None and time.monotonic() < deadline, "no write to interrupt"
        ids = experiment.trial_ids() if experiment.root.exists() else []
        history = experiment.read_trial_json(ids[0], "metrics.json") if ids else None
        # From the second evaluation on, an earlier checkpoint is already registered.
        if history and len(history) >= 2 and (experiment.trial_dir(ids[0]) / ".staging").exists():
            break
        time.sleep(0.002)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    resumed = subprocess.run(
        [sys.executable, "-m", "schedule_search.cli", "resume", "c", "--storage", storage],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = experiment.rows(0.0002)
    assert [r.state for r in rows] == ["completed"]
    trial = experiment.trial_ids()[0]
    events = [json.loads(x) for x in (experiment.trial_dir(trial) / "events.jsonl").open()]
    assert any(e["event"] == "resumed" and e["tokens"] > 0 for e in events)
    assert not (experiment.trial_dir(trial) / ".staging").exists()
