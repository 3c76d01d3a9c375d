"""Faults injected into real sweeps: a diverging trial, a SIGKILLed Ray Train worker of a
sharded (fsdp) trial, the driver killed while a worker writes a checkpoint."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import write_config
from processes import kill_session
from sweeps import (
    CLI,
    assert_ends_as_never_killed,
    checkpointed_space,
    cli_in_process,
    wait_for_a_registered_checkpoint,
)

from schedule_search.recipe import load_recipe
from schedule_search.store.experiment import Experiment


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.cost(20)
def test_a_diverging_trial_ends_as_diverged_and_the_sweep_goes_on(tmp_path, capfd):
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
    path = write_config(tmp_path / "space.yaml", space)
    storage = str(tmp_path / "runs")
    done = cli_in_process(capfd, "sweep", str(path), "--storage", storage, "--workers", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    experiment = Experiment(tmp_path / "runs" / "div")
    rows = {r.params["optimizer.lr"]: r for r in experiment.rows()}
    assert rows[1000.0].state == "diverged" and "non-finite" in rows[1000.0].reason
    assert rows[0.05].state == "completed"
    # One CPU worker trains in its Tune trial's own process: no Ray Train worker group (whose
    # workers join a gloo group, as test_cluster's record), one placement record each.
    for row in rows.values():
        records = (experiment.trial_dir(row.trial_id) / "workers").glob("rank-*.json")
        assert [json.loads(p.read_text())["backend"] for p in records] == [""]
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
@pytest.mark.cost(55)
def test_a_killed_ray_train_worker_restarts_from_the_checkpoint_exactly(tmp_path, capsys):
    """The trial is sharded (FSDP2 over its two workers): the restarted group loads the full
    checkpoint into its shards and ends where the same config trained without a kill (and
    without Ray: `train --workers 2`) ends; the sweep exports a recipe that records the
    sharding."""
    space = checkpointed_space("w", sharding="fsdp")
    path = write_config(tmp_path / "space.yaml", space)
    command = [*CLI, "sweep", str(path), "--workers", "2"]
    sweep = subprocess.Popen(
        [*command, "--storage", str(tmp_path / "b")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    experiment = Experiment(tmp_path / "b" / "w")
    trial = wait_for_a_registered_checkpoint(sweep, experiment)
    # This trial's workers, as each recorded itself (`pgrep` would also find the workers of
    # another test's Ray running beside this one).
    placements = sorted((experiment.trial_dir(trial) / "workers").glob("rank-*.json"))
    pids = [json.loads(p.read_text())["pid"] for p in placements]
    assert len(pids) == 2 and all(Path(f"/proc/{pid}").exists() for pid in pids)
    os.kill(pids[-1], signal.SIGKILL)
    assert sweep.wait(timeout=300) == 0
    assert_ends_as_never_killed(experiment, trial, tmp_path)
    recipe = tmp_path / "best.yaml"
    # export starts no Ray: run in this process (its own process is test_store_without_ray's)
    exported = cli_in_process(
        capsys, "export", "w", "--storage", str(tmp_path / "b"), "-o", str(recipe)
    )
    assert exported.returncode == 0, exported.stderr
    assert load_recipe(recipe).spec.sharding == "fsdp"


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.cost(50)
@pytest.mark.parametrize("workers", [1, 2])
def test_sweep_driver_killed_while_a_worker_writes_a_checkpoint(tmp_path, capfd, workers):
    """Ray Train workers (2) stage a checkpoint in the trial's folder and Ray uploads it; a
    one-worker trial (trained in its Tune trial's process) writes it under a temporary name in
    its run's folder. A kill in the middle of either loses nothing."""
    space = {
        "name": "c",
        "samples": 1,
        "seed": 0,
        "base": {
            "task": {"name": "linreg", "dim": 200_000, "batch": 1},  # ~5 MB of state
            "budget": {"horizon": 0.0001, "eval_at": [0.000025, 0.00005, 0.000075]},
        },
        "params": {"optimizer.lr": {"type": "loguniform", "low": 0.001, "high": 0.01}},
        "points_to_evaluate": [{"optimizer.lr": 0.003}],
    }
    path = write_config(tmp_path / "space.yaml", space)
    storage = str(tmp_path / "runs")
    driver = subprocess.Popen(
        [*CLI, "sweep", str(path), "--storage", storage, "--workers", str(workers)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    experiment = Experiment(tmp_path / "runs" / "c")
    deadline = time.monotonic() + 300
    while True:  # a checkpoint is being written
        assert driver.poll() is None and time.monotonic() < deadline, "no write to interrupt"
        ids = experiment.trial_ids() if experiment.root.exists() else []
        history = experiment.read_trial_json(ids[0], "metrics.json") if ids else None
        # From the second evaluation on, an earlier checkpoint is already registered.
        if history and len(history) >= 2 and writing(experiment, ids[0], workers):
            break
        # No write to catch before the first evaluation (the moment is from the second on):
        # until then a slower look leaves the sweep its core.
        time.sleep(0.002 if history else 0.05)
    kill_session(driver.pid)
    driver.wait()
    resumed = cli_in_process(capfd, "resume", "c", "--storage", storage)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = experiment.rows()
    assert [r.state for r in rows] == ["completed"]
    trial = experiment.trial_ids()[0]
    events = [json.loads(x) for x in (experiment.trial_dir(trial) / "events.jsonl").open()]
    assert any(e["event"] == "resumed" and e["tokens"] > 0 for e in events)
    assert not (experiment.trial_dir(trial) / ".staging").exists()
    run = experiment.train_dir / experiment.read_trial_json(trial, "config.json")["train_run"]
    assert not list(run.glob(".checkpoint_*"))  # no unfinished write left behind


def writing(experiment: Experiment, trial: str, workers: int) -> bool:
    """Whether trial's checkpoint is being written: staged in the trial's folder for Ray Train
    to upload, or (one worker) under a temporary name in its run's folder."""
    if workers > 1:
        return (experiment.trial_dir(trial) / ".staging").exists()
    record = experiment.read_trial_json(trial, "config.json")
    run = experiment.train_dir / record["train_run"] if record else None
    return run is not None and any(run.glob(".checkpoint_*"))
