"""Storage that fails: a sweep whose folder lies on a small tmpfs that fills up while its
trials train (after their first checkpoints) meets a real ENOSPC on its next writes, ends in
one line naming the path, keeps every record and Tune's last whole snapshot, and a `resume`
once the volume has room finishes every trial, the ones running when the sweep ended
included, each evaluation once. A trial whose folder turns read-only (the rest of the folder
writable) ends the sweep in one line too, never in a table that shows it as if it had ended."""

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from helpers import write_config
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from processes import kill_session
from sweeps import CLI, cli_in_process, resting_task, write_space
from sweeps import SPACE as LINREG_SPACE

from schedule_search.store.experiment import Experiment

EVAL_AT = [2.5e-5, 5e-5, 7.5e-5]
HORIZON = 1e-4
#: A 200,000-dimensional linreg: a checkpoint of its weights, momentum and EMAs is several
#: MB, so writes are still going on when the volume is filled after the first evaluation.
SPACE = {
    "name": "full",
    "samples": 2,
    "seed": 0,
    "scheduler": "fifo",  # every trial to its end: none is stopped early
    "base": {
        "task": {"name": "linreg", "dim": 200_000, "batch": 1},
        "budget": {"horizon": HORIZON, "eval_at": EVAL_AT},
    },
    "params": {"optimizer.lr": {"type": "loguniform", "low": 1e-3, "high": 1e-2}},
}


@contextlib.contextmanager
def tmpfs(mount_point: Path, size: str) -> Iterator[Path]:
    """A real size-limited filesystem at `mount_point` (needs the right to mount: root or
    CAP_SYS_ADMIN; skipped where it is refused)."""
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


@contextlib.contextmanager
def filled(volume: Path) -> Iterator[None]:
    """Within: `volume` has no free byte (a file written until the kernel refuses)."""
    filler = volume / "filler"
    with open(filler, "wb", buffering=0) as handle:
        for block in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    handle.write(b"\0" * block)
    try:
        yield
    finally:
        filler.unlink()


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """Within: `folder` is a read-only bind mount of itself, so a write in it fails with
    EROFS, as on a volume remounted read-only (needs the right to mount; skipped where it is
    refused)."""
    bound = subprocess.run(
        ["mount", "--bind", str(folder), str(folder)], capture_output=True, text=True
    )
    if bound.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {bound.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)
        yield
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@contextlib.contextmanager
def running(command: list[str], err: Path, env: dict | None = None) -> Iterator[subprocess.Popen]:
    """The CLI `command` in a session of its own, stderr to `err`; whatever of it (Ray
    included) still runs when the block is left, a failed assertion's included, is killed."""
    with err.open("w") as handle:
        process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=handle,
            start_new_session=True,
            env=os.environ | (env or {}),
        )
    try:
        yield process
    finally:
        kill_session(process.pid)


def first_evaluation(sweep: subprocess.Popen, experiment: Experiment) -> Path:
    """Wait until a trial of the running `sweep` has evaluated; return that trial's folder."""
    deadline = time.monotonic() + 300
    while not (evaluated := list(experiment.root.glob("trials/*/metrics.json"))):
        assert sweep.poll() is None and time.monotonic() < deadline, "no evaluation"
        time.sleep(0.02)
    return evaluated[0].parent


def ended(sweep: subprocess.Popen, err: Path) -> str:
    """The `sweep`'s stderr once it has ended by itself."""
    sweep.wait(timeout=300)
    return err.read_text()


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.cost(50)
def test_a_volume_that_fills_mid_run_ends_the_sweep_in_one_line_and_resume_finishes(
    tmp_path, capfd
):
    space = write_config(tmp_path / "space.yaml", SPACE)
    with tmpfs(tmp_path / "volume", "64m") as volume:
        storage = volume / "runs"
        experiment = Experiment(storage / "full")
        with running(
            [*CLI, "sweep", str(space), "--workers", "1", "--storage", str(storage)],
            tmp_path / "sweep.err",
        ) as sweep:
            first_evaluation(sweep, experiment)
            with filled(volume):  # not a byte left, mid-run
                err = ended(sweep, tmp_path / "sweep.err")
                assert sweep.returncode == 1, err[-3000:]
                lines = err.strip().splitlines()
                assert len(lines) == 1 and lines[0].startswith("sweep ended: "), err[-3000:]
                assert "[Errno 28] No space left on device" in lines[0]
                assert f"'{storage}/full/" in lines[0]  # the file that could not be written
                # At the first failure: a retry would meet the same full volume.
                assert "cannot write to the experiment folder" in lines[0], lines[0]
                states = {row.trial_id: row.state for row in experiment.rows()}
                assert len(states) == 2, states
                # `status` reads the records and shows the table (in this process: it starts
                # no Ray; its own process is test_store_without_ray's).
                shown = cli_in_process(capfd, "status", "full", "--storage", str(storage))
        assert shown.returncode == 0, shown.stderr[-3000:]
        assert all(trial_id in shown.stdout for trial_id in states)
        assert "table not written: [Errno 28] No space left on device" in shown.stdout
        resumed = cli_in_process(capfd, "resume", "full", "--storage", str(storage))
        assert resumed.returncode == 0, resumed.stderr[-3000:]

        # Every trial, the one whose write failed and the one the sweep stopped, ran to its
        # end, each evaluation once.
        rows = experiment.rows()
        assert {row.trial_id for row in rows} == set(states)
        assert all(row.state == "completed" for row in rows), [(r.state, r.reason) for r in rows]
        for row in rows:
            history = experiment.read_trial_json(row.trial_id, "metrics.json")
            assert [record["chinchilla"] for record in history] == [*EVAL_AT, HORIZON]
        study = optuna.load_study(
            study_name="full",
            storage=JournalStorage(JournalFileBackend(str(experiment.root / "optuna.journal"))),
        )
        finished = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        assert len(study.trials) == len(finished) == 2
        assert json.loads((experiment.root / "sweep.json").read_text())["samples"] == 2


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.cost(40)
def test_a_trial_whose_end_cannot_be_recorded_ends_the_sweep_in_one_line(
    tmp_path, monkeypatch, capfd
):
    """A trial's folder turns read-only mid-run while the rest of the experiment folder stays
    writable (a permission changed, one file's volume remounted): the trial fails and its end
    cannot be recorded. The sweep ends in one line that says so, exit 1, rather than write
    its table and exit 0 with the trial shown as if it were still running; once the folder
    is writable again, `resume` runs the trial to its end, each evaluation once. No retries
    (`--max-failures 0`): with them, the trial's first failure ends the sweep, before its
    end is to be recorded (the full volume's test above)."""
    code = resting_task(tmp_path)  # a trial of seconds, not a fraction of one
    base = LINREG_SPACE["base"] | {
        "task": LINREG_SPACE["base"]["task"] | {"name": "resting:make"},
        "budget": {"horizon": 1.0, "eval_at": [0.25, 0.5]},
    }
    space = write_space(tmp_path, name="lin", samples=1, scheduler="fifo", base=base)
    storage = tmp_path / "runs"
    experiment = Experiment(storage / "lin")
    command = [*CLI, "sweep", str(space), "--workers", "1", "--storage", str(storage)]
    command += ["--max-failures", "0"]
    err_file = tmp_path / "sweep.err"
    with running(command, err_file, {"PYTHONPATH": str(code)}) as sweep:
        trial = first_evaluation(sweep, experiment)
        with read_only(trial):
            err = ended(sweep, err_file)
    assert sweep.returncode == 1, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sweep ended: "), err[-3000:]
    assert f"trial {trial.name}'s end could not be recorded" in lines[0], lines[0]
    assert "[Errno 30] Read-only file system" in lines[0] and str(trial) in lines[0], lines[0]
    assert not (trial / "result.json").exists()
    monkeypatch.setenv("PYTHONPATH", str(code))  # for the trials' processes
    monkeypatch.syspath_prepend(str(code))  # for the driver's
    resumed = cli_in_process(capfd, "resume", "lin", "--storage", str(storage))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (row,) = experiment.rows()
    assert row.trial_id == trial.name and row.state == "completed", (row.state, row.reason)
    history = experiment.read_trial_json(trial.name, "metrics.json")
    assert [record["chinchilla"] for record in history] == [0.25, 0.5, 1.0]
