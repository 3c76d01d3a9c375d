"""Real sweeps for the integration tests: the linreg space, the CLI, kills at chosen moments."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml
from processes import kill_session

from schedule_search.core import checkpoint as ckpt
from schedule_search.core.config import parse
from schedule_search.store.experiment import Experiment
from schedule_search.train.config import TrainConfig
from schedule_search.train.launch import run_local

SPACE = {
    "name": "lin",
    "samples": 3,
    "seed": 0,
    "startup_trials": 2,  # TPE itself (not its random start-up) proposes the later trials
    "base": {
        "task": {"name": "linreg", "dim": 64, "batch": 16},
        "optimizer": {"name": "sgd", "lr": 0.05},
        "schedule": {"kind": "poly", "warmup": 0.0},
        "ema": {"fractions": [0.0, 0.01, 0.04, 0.16], "objective": "best"},
        "window": {"policy": "microbatches", "microbatches": 2},
        "budget": {"horizon": 4.0, "eval_at": [1.0, 2.0]},
    },
    "params": {
        "optimizer.lr": {"type": "loguniform", "low": 0.01, "high": 0.3},
        "schedule.gamma": {"type": "uniform", "low": 0.0, "high": 1.0},
        "schedule.alpha": {"type": "loguniform", "low": 0.4, "high": 40.0},
    },
}
FRACTIONS = SPACE["base"]["ema"]["fractions"]


#: The command line as a user runs it, in this interpreter.
CLI = [sys.executable, "-m", "schedule_search.cli"]


def cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=540,
        **kwargs,
    )


def cli_in_process(capture, *args: str) -> subprocess.CompletedProcess:
    """`cli(*args)` run in this process by `main`: the same exit code and output, without a
    new interpreter's seconds of imports (~4 CPU-s for a sweep's driver, a sixth of a short
    sweep). For a verb that starts no Ray (status, export, report; a sweep, resume or
    transfer refused before Ray), or a sweep, resume or transfer run to its end: `main` shuts
    its local Ray down and puts back the variables it set for that Ray alone; what stays set
    is what every sweep sets for the processes of its Ray (`ray_env.DRIVER_ENVIRONMENT`,
    Ray's own), as any later sweep would. Not for a run to be killed or signalled: that takes
    a process of its own. `capture` is the test's capfd (the process's output, what is
    written below Python included) or capsys; what it held before is dropped. The verbs' own
    processes are test_store_without_ray's and the kill tests'."""
    from schedule_search.cli import main

    capture.readouterr()
    code = main(list(args))
    out, err = capture.readouterr()
    return subprocess.CompletedProcess([*CLI, *args], code, out, err)


#: The shipped search spaces.
SPACES = Path(__file__).resolve().parents[1] / "search_spaces"


def sweep_shipped_space(
    capture, tmp_path: Path, name: str, samples: int, horizon: float = 0.1
) -> tuple[dict, Experiment]:
    """Sweep the shipped space `name` on one worker, shortened to `samples` trials to
    `horizon` (Chinchilla multiples, evaluated at half of it too; FIFO): the machinery, not
    the search, is under test. Run in this process (`cli_in_process`, `capture` its capfd).
    Returns the space as shipped and the experiment the sweep wrote."""
    shipped = yaml.safe_load((SPACES / f"{name}.yaml").read_text())
    space = json.loads(json.dumps(shipped))
    space.update(samples=samples, startup_trials=samples // 2, scheduler="fifo")
    space.pop("first_rung", None)  # a rung of the shipped budget, replaced here
    space["base"]["budget"] = {"horizon": horizon, "eval_at": [horizon / 2]}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(space))
    storage = tmp_path / "runs"
    done = cli_in_process(capture, "sweep", str(path), "--workers", "1", "--storage", str(storage))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return shipped, Experiment(storage / space["name"])


def write_space(tmp_path: Path, **changes) -> Path:
    space = json.loads(json.dumps(SPACE))
    space.update(changes)
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    return path


#: A user's task module: linreg that sleeps 50 ms before each micro-batch, so a trial lasts
#: as long as a test needs it to (to probe it, or change its storage, while it trains) at a
#: few percent of a CPU. Named `resting:make` in a space; its folder goes on PYTHONPATH.
RESTING_TASK = """
import time

from schedule_search.tasks.linreg import build


class Resting:
    def __init__(self, task):
        self.task = task

    def __getattr__(self, name):
        return getattr(self.task, name)

    def microbatch(self, index, rank, world_size):
        time.sleep(0.05)
        return self.task.microbatch(index, rank, world_size)


def make(seed, **options):
    return Resting(build(options, seed=seed))
"""


def resting_task(tmp_path: Path) -> Path:
    """The folder holding `resting.py` (`RESTING_TASK`), for PYTHONPATH."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "resting.py").write_text(RESTING_TASK)
    return code


def trial_records(experiment: Experiment) -> dict[str, dict]:
    return {
        t: {
            "params": experiment.read_trial_json(t, "config.json")["params"],
            "result": experiment.read_trial_json(t, "result.json"),
            "metrics": experiment.read_trial_json(t, "metrics.json"),
        }
        for t in experiment.trial_ids()
    }


def kill_at(command: list[str], storage: Path, moment: str, env: dict | None = None) -> str:
    """Run the CLI `command` (a sweep or a resume), SIGKILL it (and its session: Ray) at
    `moment`; return the id of the trial interrupted (or finished, or "" before any)."""
    experiment = Experiment(storage / "lin")
    driver = subprocess.Popen(
        [sys.executable, "-m", "schedule_search.cli", *command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    interrupted = None
    deadline = time.monotonic() + 400
    while interrupted is None:
        assert driver.poll() is None, "the sweep ended before it could be killed"
        assert time.monotonic() < deadline, "no moment to kill at"
        records = trial_records(experiment) if experiment.root.exists() else {}
        finished = [t for t, r in records.items() if r["result"]]
        # Two evaluations in: the first one's checkpoint is complete (the second was reported
        # after it was stored), whatever Ray had registered when the kill lands.
        running = [
            t for t, r in records.items() if len(r["metrics"] or []) >= 2 and not r["result"]
        ]
        if moment == "after_a_trial_finished" and finished and not running:
            interrupted = finished[0]
        if moment == "in_the_middle_of_a_trial" and running:
            interrupted = running[0]
        started = (experiment.root / "sweep.json").exists()
        if moment == "before_the_first_trial_starts" and started and not records:
            interrupted = ""
        # Every 10 ms once a trial still running has recorded an evaluation (a trial ends, or
        # is two evaluations in, only after its first): the kill lands close behind the moment,
        # a trial just ended (before Tune's next snapshot) or in its last stretch. Before that,
        # every 50 ms, leaving the sweep its core: the moment before the first trial's folder
        # lasts as long as Ray takes to start, seconds.
        evaluating = any(r["metrics"] and not r["result"] for r in records.values())
        if interrupted is None:
            time.sleep(0.01 if evaluating else 0.05)
    # No pause for Tune's snapshot: what finished or started since its last one must survive too.
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    kill_session(driver.pid)  # what a dead machine takes with it: Ray and its workers
    return interrupted


def start_and_kill(space: Path, storage: Path, moment: str, *flags: str) -> str:
    """`flags` replace the default of one trial of 2 Ray Train workers at a time."""
    launch = flags or ("--workers", "2")
    return kill_at(["sweep", str(space), "--storage", str(storage), *launch], storage, moment)


def SHARES_THE_FINISHED_SWEEP(test):
    """The marks of tests that use the `finished_sweep` fixture: pytest-xdist (`--dist
    loadgroup`) runs them in one worker, so the sweep is made once; each carries a share of the
    group's ~165 s, the sweep's ~105 s included (their group's cost orders it among the slow
    tests)."""
    return pytest.mark.cost(11)(pytest.mark.xdist_group("finished_sweep")(test))


@dataclass(frozen=True)
class FinishedSweep:
    """A sweep killed before its first trial and resumed to its end (`resumed`: that resume's
    output). `storage` is left as it was: copy it (`copy_to`) before changing anything."""

    storage: Path
    resumed: subprocess.CompletedProcess

    name = SPACE["name"]
    horizon = SPACE["base"]["budget"]["horizon"]

    def copy_to(self, tmp_path: Path) -> tuple[Path, Experiment]:
        storage = tmp_path / "runs"
        shutil.copytree(self.storage, storage)
        return storage, Experiment(storage / self.name)


def finish_a_killed_sweep(tmp_path: Path) -> FinishedSweep:
    """Killed before its first trial, resumed to the end, all beside another local Ray (this
    process's): with two Rays on a machine, Ray Train's placement-group cleaner used to lose
    track of its own, so a trial ASHA stopped never freed its workers and the next trial
    waited forever (`test_sweep` checks that a trial started after a stopped one)."""
    import ray

    space = write_space(tmp_path)
    storage = tmp_path / "runs"
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR")
    try:
        start_and_kill(space, storage, "before_the_first_trial_starts")
        resumed = cli("resume", SPACE["name"], "--storage", str(storage))
    finally:
        ray.shutdown()
    return FinishedSweep(storage, resumed)


def wait_for_a_registered_checkpoint(sweep: subprocess.Popen, experiment: Experiment) -> str:
    """Wait until the sweep's first trial has evaluated twice with a checkpoint uploaded and
    registered; return its id. The moment to take its workers away: a kill before Ray Train
    registers the checkpoint (at its next poll, every 0.5 s here) restarts from scratch,
    correctly, and a test would show nothing."""
    deadline = time.monotonic() + 300
    while True:
        assert sweep.poll() is None and time.monotonic() < deadline, "no moment to kill at"
        ids = experiment.trial_ids() if experiment.root.exists() else []
        history = experiment.read_trial_json(ids[0], "metrics.json") if ids else None
        uploaded = ids and ckpt.checkpoint_folders(experiment.train_run_dir(ids[0]))
        if history and len(history) >= 2 and uploaded:
            break
        time.sleep(0.05)
    time.sleep(1.0)
    assert sweep.poll() is None, "the trial ended before its workers could be killed"
    return ids[0]


def assert_ends_as_never_killed(experiment: Experiment, trial_id: str, tmp_path: Path) -> None:
    """The trial resumed from a checkpoint and ended with the parameters and EMA bank of its
    own config trained on two gloo ranks by the trainer `train` runs, without Ray, never
    killed (in this process: the ranks fork from its warm forkserver)."""
    events = [json.loads(x) for x in (experiment.trial_dir(trial_id) / "events.jsonl").open()]
    assert any(e["event"] == "resumed" and e["tokens"] > 0 for e in events)
    config = experiment.read_trial_json(trial_id, "config.json")["config"]
    straight = tmp_path / "straight"
    run_local(parse(TrainConfig, config, "config.json"), straight, workers=2)
    a = ckpt.load_latest(straight / "checkpoints")[1]
    b = ckpt.load_latest(experiment.train_run_dir(trial_id))[1]
    assert b["progress"]["status"] == "completed"
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    for fraction, averages in a["ema"]["averages"].items():
        restarted = b["ema"]["averages"][fraction]
        assert all(torch.equal(x, y) for x, y in zip(averages, restarted, strict=True))


def checkpointed_space(name: str, **base: object) -> dict:
    """One linreg trial of 2 micro-batch windows to 6x, evaluated (and checkpointed) at every
    1x: long enough to lose its workers mid-run, and bit-reproducible. `base` adds to its
    base config (a sharding, say)."""
    return {
        "name": name,
        "samples": 1,
        "seed": 0,
        "base": {
            "task": {"name": "linreg", "dim": 256, "batch": 16},
            "window": {"policy": "microbatches", "microbatches": 2},
            "budget": {"horizon": 6.0, "eval_at": [float(m) for m in range(1, 6)]},
            **base,
        },
        "params": {"optimizer.lr": {"type": "loguniform", "low": 0.001, "high": 0.01}},
        "points_to_evaluate": [{"optimizer.lr": 0.003}],
    }
