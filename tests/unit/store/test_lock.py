"""The experiment lock: a second driver is refused in one line, naming the holder, and the
lock is free again once the holder lets go (a killed holder: tests/integration/store)."""

import fcntl
import threading

from schedule_search.cli import main
from schedule_search.store.experiment import Experiment, SweepSettings
from schedule_search.store.lock import experiment_lock


def test_a_second_driver_is_refused_in_one_line_until_the_holder_lets_go(tmp_path, capsys):
    experiment = Experiment(tmp_path / "runs" / "x")
    experiment.root.mkdir(parents=True)
    experiment.save_settings(SweepSettings(name="x", samples=1, workers=1, concurrency=1))
    # an flock belongs to its open file, so a second open in this process is refused as
    # another process's would be
    with experiment_lock(experiment.root, "sweep"):
        assert main(["resume", "x", "--storage", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "already running (`sweep` by pid" in err and err.count("\n") == 1
    with experiment_lock(experiment.root, "resume"):
        pass


def test_a_driver_starting_while_status_probes_the_lock_waits_the_probe_out(tmp_path):
    """`status` holds a shared flock for an instant to ask whether a driver runs; a driver
    starting in that instant takes the lock once the probe lets go, instead of refusing."""
    root = tmp_path / "x"
    root.mkdir()
    (root / ".lock").write_text("`sweep` by pid 1 since earlier (a driver long gone)")
    probe = open(root / ".lock")  # noqa: SIM115 - released by the timer below
    fcntl.flock(probe, fcntl.LOCK_SH)
    threading.Timer(0.1, probe.close).start()  # closing the file releases its flock
    with experiment_lock(root, "resume"):
        assert "`resume` by pid" in (root / ".lock").read_text()
