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
from sweeps import SHARES_THE_FINISHED_SWEEP, cli_in_process

from schedule_search.store.experiment import Experiment
from schedule_search.train.launch import free_port

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


@SHARES_THE_FINISHED_SWEEP
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_record_of_the_best_trial_is_named_and_never_ranked(
    finished_sweep, tmp_path, capsys, damage
):
    storage, experiment = finished_sweep.copy_to(tmp_path)
    name, horizon = finished_sweep.name, finished_sweep.horizon
    best = experiment.best(horizon)
    assert best is not None
    record, change = DAMAGE[damage]
    path = experiment.trial_dir(best.trial_id) / record
    path.write_text(change(path.read_text()))

    done = cli_in_process(capsys, "status", name, "--storage", str(storage))
    code, err = done.returncode, done.stderr
    assert code == 0
    assert err.count("\n") == 1 and str(path) in err and "left out" in err, err
    row = next(r for r in experiment.rows() if r.trial_id == best.trial_id)
    assert row.state == "corrupt" and str(path) in row.reason
    assert experiment.best(horizon) is None or experiment.best(horizon).trial_id != best.trial_id

    # export refuses rather than silently pick another trial; nothing is written
    done = cli_in_process(capsys, "export", name, "--storage", str(storage))
    code, err = done.returncode, done.stderr
    assert code == 2 and err.count("\n") == 1 and str(path) in err, err
    assert not (experiment.root / "recipe.yaml").exists()

    done = cli_in_process(capsys, "report", name, "--storage", str(storage))
    code, err = done.returncode, done.stderr
    assert code == 0 and err.count("\n") == 1 and str(path) in err, err
    assert (experiment.root / "report" / "report.md").is_file()


@SHARES_THE_FINISHED_SWEEP
@pytest.mark.parametrize("state", ["searcher-state", "callback-states", "experiment_state"])
def test_damaged_tune_state_is_one_line_and_no_hang(finished_sweep, tmp_path, state):
    storage, experiment = finished_sweep.copy_to(tmp_path)
    if state != "experiment_state":
        target = next(experiment.tune_dir.glob(f"{state}-*.pkl"))
        target.write_bytes(os.urandom(4096))
    else:
        target = sorted(experiment.tune_dir.glob("experiment_state-*.json"))[-1]
        target.write_text(target.read_text()[:500])
    before = {t: experiment.read_trial_json(t, "result.json") for t in experiment.trial_ids()}
    done = subprocess.run(
        [*CLI, "resume", finished_sweep.name, "--storage", str(storage)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(target) in lines[0] and "damaged" in lines[0], lines
    after = {t: experiment.read_trial_json(t, "result.json") for t in experiment.trial_ids()}
    assert after == before  # nothing changed


#: Restore a sweep's Tune state as Tune does (argv[2] "tune") or as the sweep does ("sweep"),
#: in a process of its own: Ray's loggers write to the stderr they found at import, which in
#: a test process is an earlier test's capture.
RESTORE = """
import sys
from ray import tune
from schedule_search.store.experiment import Experiment
from schedule_search.sweep.driver import restore_tuner
from schedule_search.sweep.trial import run_trial
from schedule_search.sweep.tune_storage import tune_filesystem

experiment = Experiment(sys.argv[1])
if sys.argv[2] == "tune":
    tune.Tuner.restore(
        str(experiment.tune_dir), trainable=run_trial, storage_filesystem=tune_filesystem()
    )
else:
    restore_tuner(experiment, run_trial)  # Tune checks the trainable by name
"""


@SHARES_THE_FINISHED_SWEEP
def test_a_restore_is_silent_on_a_trial_whose_tune_results_are_not_written_yet(
    finished_sweep, tmp_path
):
    """A driver killed after Tune saw a trial's first report but before Tune's result files of
    that trial were written whole (they are, on close) leaves a snapshot that names results
    with no files. Restoring it (what `resume` does) says nothing of it: Tune's warning about
    metrics it could not fetch is noise to a user, whose records are the trial's own."""
    _, experiment = finished_sweep.copy_to(tmp_path)
    trial_folder = next(experiment.tune_dir.glob("run_trial_*"))
    for written_on_close in ("result.json", "progress.csv"):
        (trial_folder / written_on_close).unlink()

    def restored(how: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", RESTORE, str(experiment.root), how],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout + done.stderr

    # The condition is real: Tune's own restore of this folder warns about it ...
    assert "fetch metrics" in restored("tune")
    # ... and the sweep's says nothing of it.
    assert "fetch metrics" not in restored("sweep")


def test_records_are_readable_as_the_umask_allows(tmp_path):
    """Atomic writes go through private temporary files; what lands has an ordinary mode."""
    from schedule_search.core.checkpoint import save_state
    from schedule_search.core.files import atomic_write_text

    atomic_write_text(tmp_path / "atomic.json", "{}")
    (tmp_path / "plain.json").write_text("{}")
    save_state(tmp_path / "checkpoint", {"x": 1})
    (tmp_path / "plain-folder").mkdir()
    mode = lambda p: (tmp_path / p).stat().st_mode & 0o777  # noqa: E731
    assert mode("atomic.json") == mode("plain.json")
    assert mode("checkpoint") == mode("plain-folder")


def evaluations(experiment: Experiment) -> dict[str, int]:
    """trial id -> how many evaluations it has recorded before its horizon (2x)."""
    if not experiment.root.exists():
        return {}
    counts = {}
    for trial in experiment.trial_ids():
        history = experiment.read_trial_json(trial, "metrics.json") or []
        counts[trial] = len([h for h in history if h["chinchilla"] < 2.0])
    return counts


def signal_mid_trial(
    command: list[str], experiment: Experiment, number: int, before: dict[str, int]
) -> tuple[str, dict[str, int]]:
    """Run `command`; once a trial has evaluated (before its horizon) more than `before` says
    it had, send `number`, and check the driver stops cleanly. Returns the driver's last line
    of stderr and the evaluations at the signal."""
    driver = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    deadline = time.monotonic() + 300
    now = evaluations(experiment)
    while not any(n > before.get(t, 0) for t, n in now.items()):
        assert driver.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
        now = evaluations(experiment)
    # Ctrl-C reaches the terminal's whole process group; a scheduler's SIGTERM the driver.
    if number == signal.SIGINT:
        os.killpg(driver.pid, number)
    else:
        driver.send_signal(number)
    _, err = driver.communicate(timeout=240)
    assert driver.returncode == 128 + number, err[-3000:]
    assert "Traceback" not in err and "Tuner.restore" not in err, err[-3000:]
    ended = [experiment.read_trial_json(t, "result.json") for t in experiment.trial_ids()]
    assert not all(ended), "the signal landed after the sweep ended; lengthen the trials"
    return err.strip().splitlines()[-1], now


@pytest.mark.cost(75)
def test_signals_stop_a_sweep_that_resumes_moved_and_renamed(tmp_path, capfd):
    """Ctrl-C stops a sweep mid-trial; its folder is moved to another storage and renamed at
    once; resumed there, SIGTERM stops it mid-trial again; resumed again, it completes where
    its folder is now, nothing is written at the old place, and export picks the best."""
    storage = tmp_path / "runs"
    base = json.loads(json.dumps(SPACE["base"]))
    base["task"]["dim"] = 512
    first = Experiment(storage / "off")
    command = sweep_command(tmp_path, storage, samples=2, base=base)
    last, _ = signal_mid_trial(command, first, signal.SIGINT, {})
    assert f"resume off --storage {storage}" in last and "SIGINT" in last, last

    new_storage, name = tmp_path / "elsewhere", "off2"
    new_storage.mkdir()
    shutil.move(storage / "off", new_storage / name)
    experiment = Experiment(new_storage / name)
    resume = [*CLI, "resume", name, "--storage", str(new_storage)]
    # What the trials recorded while they stopped counts as before the resume.
    last, _ = signal_mid_trial(resume, experiment, signal.SIGTERM, evaluations(experiment))
    assert f"resume {name} --storage {new_storage}" in last and "SIGTERM" in last, last

    done = cli_in_process(capfd, "resume", name, "--storage", str(new_storage))
    assert done.returncode == 0, done.stderr[-3000:]
    assert not first.root.exists(), "nothing may be written at the old place"
    rows = experiment.rows()
    assert len(rows) == 2 and all(r.state == "completed" for r in rows), rows
    finals = {
        t: experiment.read_trial_json(t, "metrics.json")[-1]["val_loss"]
        for t in experiment.trial_ids()
    }
    # export starts no Ray: run in this process (its own process is test_store_without_ray's)
    done = cli_in_process(capfd, "export", name, "--storage", str(new_storage))
    code, err = done.returncode, done.stderr
    assert code == 0, err
    recipe = yaml.safe_load((experiment.root / "recipe.yaml").read_text())
    assert recipe["source"]["trial_id"] == min(finals, key=finals.get)


TASK_MODULE = '''"""A user's task: linreg under another name, importable only where this file is."""
from schedule_search.tasks.linreg import build


def make(seed, **options):
    return build(options, seed=seed)
'''


@pytest.fixture(scope="module")
def user_task_cluster():
    """A head of no CPUs and one node of 2 CPUs, started by this test process (so the node has
    neither a driver's PYTHONPATH nor its working directory): (the cluster, the node). Started
    once for both cases of `test_a_user_task_reaches_a_node_that_lacks_it` (one xdist group:
    one worker runs them), shut down after them."""
    from ray.cluster_utils import Cluster

    head = {"num_cpus": 0, "include_dashboard": True, "dashboard_port": free_port()}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        yield cluster, cluster.add_node(num_cpus=2)
    finally:
        cluster.shutdown()


# One cluster for both cases: each case's sweep is a driver process of its own, so a Ray job
# of its own, with its own workers (Ray never hands a job's workers to another job), its own
# runtime_env, storage, working directory and PYTHONPATH; the job before has ended (its driver
# exited, its workers and CPUs freed) when the next starts. What a case asserts is its own
# records and exit, and the node's id, the same node either way. The one thing a case leaves
# on the node that bears on the module is the shipped case's runtime_env package (cached by the
# node's agent, its URI kept by the GCS), so the shipped case runs second: the not-shipped case
# meets a node that never had the module, as on a cluster of its own, and ships nothing that
# could let the shipped case's trials import the module but by its own shipping.
@pytest.mark.cost(25)
@pytest.mark.xdist_group("user_task_cluster")
@pytest.mark.parametrize("shipped", [False, True])
def test_a_user_task_reaches_a_node_that_lacks_it(tmp_path, shipped, user_task_cluster):
    """A cluster node started without the user's module on its path: the sweep ships it
    (runtime_env), or, where it is not shipped, ends at the first trial in one line."""
    cluster, node = user_task_cluster
    code = tmp_path / "code"
    code.mkdir()
    (code / "usertask.py").write_text(TASK_MODULE)
    base = json.loads(json.dumps(SPACE["base"])) | {
        "task": {"name": "usertask:make", "dim": 64, "batch": 16}
    }
    storage = tmp_path / "runs"
    # Shipped, one trial shows the module reached the node; not shipped, the second of two
    # trials shows the sweep ended at the first (a module that cannot be imported fails the
    # same way every time).
    samples = 1 if shipped else 2
    command = [*sweep_command(tmp_path, storage, samples=samples, base=base), "--concurrency", "1"]
    if not shipped:
        command += ["--max-failures", "0"]
    # The driver imports the module from its PYTHONPATH; the nodes, started by this test
    # process, have neither that path nor the driver's working directory.
    env = os.environ | {"PYTHONPATH": str(code), "RAY_ADDRESS": ""}
    if not shipped:  # in a site-packages folder: installed, for the sweep, so not shipped
        installed = tmp_path / "site-packages"
        installed.mkdir()
        shutil.move(code / "usertask.py", installed / "usertask.py")
        env["PYTHONPATH"] = str(installed)
    done = subprocess.run(
        [*command, "--address", cluster.address],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=400,
    )
    experiment = Experiment(storage / "off")
    if shipped:
        assert done.returncode == 0, done.stderr[-3000:]
        (row,) = experiment.rows()
        assert row.state == "completed", (row.state, row.reason)
        placement = json.loads(
            (experiment.trial_dir(row.trial_id) / "workers" / "rank-0.json").read_text()
        )
        assert placement["node_id"] == node.node_id
    else:
        assert done.returncode == 1, done.stderr[-3000:]
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("sweep ended: trials cannot start: ") and "usertask" in last
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
        assert len(experiment.trial_ids()) == 1  # the second trial never started


@SHARES_THE_FINISHED_SWEEP
@pytest.mark.parametrize(
    "task",
    [
        {"name": "a_module_not_here:make", "dim": 64},
        {"name": "tinylm", "data": "/nonexistent/corpus/that/moved"},
    ],
)
def test_status_export_and_report_read_the_records_alone(finished_sweep, tmp_path, capsys, task):
    """The task's module or data gone from this machine: reading the sweep still works."""
    storage, experiment = finished_sweep.copy_to(tmp_path)
    space = yaml.safe_load((experiment.root / "space.yaml").read_text())
    space["base"]["task"] = task
    (experiment.root / "space.yaml").write_text(yaml.safe_dump(space))
    for verb in ("status", "export", "report"):
        done = cli_in_process(capsys, verb, finished_sweep.name, "--storage", str(storage))
        code, err = done.returncode, done.stderr
        assert code == 0 and err == "", (verb, err)
    assert (experiment.root / "recipe.yaml").is_file()
