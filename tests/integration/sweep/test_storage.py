"""Storage that fills: a sweep whose folder lies on a small tmpfs that fills up while its
trials train (after their first checkpoints) meets a real ENOSPC on its next writes, ends in
one line naming the path, keeps every record and Tune's last whole snapshot, and a `resume`
once the volume has room finishes every trial, the ones running when the sweep ended
included, each evaluation once."""

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from helpers import write_config
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from sweeps import CLI, cli

from schedule_search.store.experiment import Experiment

EVAL_AT = [5e-5, 1e-4, 1.5e-4]
HORIZON = 2e-4
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


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.cost(80)
def test_a_volume_that_fills_mid_run_ends_the_sweep_in_one_line_and_resume_finishes(tmp_path):
    space = write_config(tmp_path / "space.yaml", SPACE)
    with tmpfs(tmp_path / "volume", "64m") as volume:
        storage = volume / "runs"
        experiment = Experiment(storage / "full")
        sweep = subprocess.Popen(
            [*CLI, "sweep", str(space), "--workers", "1", "--storage", str(storage)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 300
        while not list(experiment.root.glob("trials/*/metrics.json")):
            assert sweep.poll() is None and time.monotonic() < deadline, "no evaluation"
            time.sleep(0.02)
        with filled(volume):  # not a byte left, mid-run
            _, err = sweep.communicate(timeout=300)
            assert sweep.returncode == 1, err[-3000:]
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("sweep ended: "), err[-3000:]
            assert "[Errno 28] No space left on device" in lines[0]
            assert f"'{storage}/full/" in lines[0]  # the file that could not be written
            states = {row.trial_id: row.state for row in experiment.rows()}
            assert len(states) == 2, states
            # `status` reads the records and shows the table.
            shown = cli("status", "full", "--storage", str(storage))
        assert shown.returncode == 0, shown.stderr[-3000:]
        assert all(trial_id in shown.stdout for trial_id in states)
        assert "table not written: [Errno 28] No space left on device" in shown.stdout
        resumed = cli("resume", "full", "--storage", str(storage))
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
