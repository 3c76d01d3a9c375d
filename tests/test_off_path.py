"""States a user reaches off the happy path, on real sweeps (local Ray, real files, real
signals): damaged records and Tune state are named in one line and never ranked, and Ctrl-C
or SIGTERM stop a sweep that `resume` then completes."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from schedule_search.cli import main
from schedule_search.experiment import Experiment

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SPACE = {
    "name": "off",
    "samples": 3,
    "seed": 0,
    "scheduler": "fifo",
    "base": {
        "task": {"name": "linreg", "dim": 64, "batch": 16},
        "optimizer": {"name": "sgd", "lr": 0.05},
        "window": {"policy": "microbatches", "microbatches": 2},
        "budget": {"horizon": 2.0, "eval_at": [0.5, 1.0, 1.5]},
    },
    "params": {"optimizer.lr": {"type": "loguniform", "low": 0.01, "high": 0.3}},
    "points_to_evaluate": [{"optimizer.lr": 0.05}],
}
CLI = [sys.executable, "-m", "schedule_search.cli"]


def sweep_command(tmp: Path, storage: Path, **changes) -> list[str]:
    space = tmp / "space.yaml"
    space.write_text(yaml.safe_dump(SPACE | changes))
    return [*CLI, "sweep", str(space), "--workers", "1", "--storage", str(storage)]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished sweep, copied by each test that damages it."""
    tmp = tmp_path_factory.mktemp("finished")
    done = subprocess.run(sweep_command(tmp, tmp / "runs"), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp / "runs"


def copy_of(finished: Path, tmp_path: Path) -> tuple[Path, Experiment]:
    storage = tmp_path / "runs"
    shutil.copytree(finished, storage)
    return storage, Experiment(storage / "off")


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


DAMAGE = {
    "result.json cut short": ("result.json", lambda text: text[: len(text) // 2]),
    "metrics.json random bytes": ("metrics.json", lambda text: os.urandom(200).hex()[:150]),
    "metrics.json not a list": ("metrics.json", lambda text: '{"val_loss": 0.1}'),
    "config.json garbage params": ("config.json", lambda text: '{"params": 3, "config": {}}'),
    "config.json not a config": (
        "config.json",
        lambda text: json.dumps({"params": {}, "config": {"optimizer": {"lr": "fast"}}}),
    ),
    "result.json unknown state": ("result.json", lambda text: '{"state": "great"}'),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_record_of_the_best_trial_is_named_and_never_ranked(
    finished, tmp_path, capsys, damage
):
    storage, experiment = copy_of(finished, tmp_path)
    best = experiment.best(2.0)
    assert best is not None
    name, change = DAMAGE[damage]
    path = experiment.trial_dir(best.trial_id) / name
    path.write_text(change(path.read_text()))

    code, err = run_cli(capsys, "status", "off", "--storage", str(storage))
    assert code == 0
    assert err.count("\n") == 1 and str(path) in err and "left out" in err, err
    row = next(r for r in experiment.rows(2.0) if r.trial_id == best.trial_id)
    assert row.state == "corrupt" and str(path) in row.reason
    assert experiment.best(2.0) is None or experiment.best(2.0).trial_id != best.trial_id

    # export refuses rather than silently pick another trial; nothing is written
    code, err = run_cli(capsys, "export", "off", "--storage", str(storage))
    assert code == 2 and err.count("\n") == 1 and str(path) in err, err
    assert not (experiment.root / "recipe.yaml").exists()

    code, err = run_cli(capsys, "report", "off", "--storage", str(storage))
    assert code == 0 and err.count("\n") == 1 and str(path) in err, err
    assert (experiment.root / "report" / "report.md").is_file()


@pytest.mark.parametrize("state", ["searcher-state", "experiment_state"])
def test_damaged_tune_state_is_one_line_and_no_hang(finished, tmp_path, state):
    storage, experiment = copy_of(finished, tmp_path)
    if state == "searcher-state":
        target = next(experiment.tune_dir.glob("searcher-state-*.pkl"))
        target.write_bytes(os.urandom(4096))
    else:
        target = sorted(experiment.tune_dir.glob("experiment_state-*.json"))[-1]
        target.write_text(target.read_text()[:500])
    before = {t: experiment.read_trial_json(t, "result.json") for t in experiment.trial_ids()}
    done = subprocess.run(
        [*CLI, "resume", "off", "--storage", str(storage)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(target) in lines[0] and "damaged" in lines[0], lines
    after = {t: experiment.read_trial_json(t, "result.json") for t in experiment.trial_ids()}
    assert after == before  # nothing changed


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_sweep_and_resume_completes_it(tmp_path, number):
    storage = tmp_path / "runs"
    base = json.loads(json.dumps(SPACE["base"]))
    base["task"]["dim"] = 2048  # trials long enough that the signal lands mid-trial
    command = sweep_command(tmp_path, storage, samples=1, base=base)
    driver = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    experiment = Experiment(storage / "off")
    deadline = time.monotonic() + 300
    while not any(experiment.read_trial_json(t, "metrics.json") for t in experiment.trial_ids()):
        assert driver.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    # Ctrl-C reaches the terminal's whole process group; a scheduler's SIGTERM the driver.
    if number == signal.SIGINT:
        os.killpg(driver.pid, number)
    else:
        driver.send_signal(number)
    _, err = driver.communicate(timeout=240)
    assert driver.returncode == 128 + number, err[-3000:]
    assert "Traceback" not in err and "Tuner.restore" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert f"resume off --storage {storage}" in last and signal.Signals(number).name in last
    assert not any(
        (experiment.read_trial_json(t, "result.json") or {}).get("state") == "completed"
        for t in experiment.trial_ids()
    ), "the signal landed after the sweep ended; lengthen the trials"

    done = subprocess.run(
        [*CLI, "resume", "off", "--storage", str(storage)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = experiment.rows(2.0)
    assert len(rows) == 1 and rows[0].state == "completed", rows


def test_records_are_readable_as_the_umask_allows(tmp_path):
    """Atomic writes go through private temporary files; what lands has an ordinary mode."""
    from schedule_search.checkpoint import atomic_write_text, save_state

    atomic_write_text(tmp_path / "atomic.json", "{}")
    (tmp_path / "plain.json").write_text("{}")
    save_state(tmp_path / "checkpoint", {"x": 1})
    (tmp_path / "plain-folder").mkdir()
    mode = lambda p: (tmp_path / p).stat().st_mode & 0o777  # noqa: E731
    assert mode("atomic.json") == mode("plain.json")
    assert mode("checkpoint") == mode("plain-folder")


def test_a_killed_sweep_moved_and_renamed_resumes_where_its_folder_is_now(tmp_path):
    storage = tmp_path / "runs"
    base = json.loads(json.dumps(SPACE["base"]))
    base["task"]["dim"] = 512
    driver = subprocess.Popen(
        sweep_command(tmp_path, storage, base=base),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    first = Experiment(storage / "off")
    deadline = time.monotonic() + 300
    while not (
        any(first.read_trial_json(t, "result.json") for t in first.trial_ids())
        and len(first.trial_ids()) >= 2
    ):
        assert driver.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    # Moved to another storage and renamed at once: both the path and the name change.
    new_storage, name = tmp_path / "elsewhere", "off2"
    new_storage.mkdir()
    shutil.move(storage / "off", new_storage / name)
    done = subprocess.run(
        [*CLI, "resume", name, "--storage", str(new_storage)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert not first.root.exists(), "nothing may be written at the old place"
    experiment = Experiment(new_storage / name)
    rows = experiment.rows(2.0)
    assert len(rows) == 3 and all(r.state == "completed" for r in rows), rows
    finals = {
        t: experiment.read_trial_json(t, "metrics.json")[-1]["val_loss"]
        for t in experiment.trial_ids()
    }
    exported = subprocess.run(
        [*CLI, "export", name, "--storage", str(new_storage)], capture_output=True, text=True
    )
    assert exported.returncode == 0, exported.stderr
    recipe = yaml.safe_load((experiment.root / "recipe.yaml").read_text())
    assert recipe["source"]["trial_id"] == min(finals, key=finals.get)
