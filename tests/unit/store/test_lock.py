"""The experiment lock: a second driver is refused in one line, naming the holder, and the
lock is free again once the holder lets go (a killed holder: tests/integration/store)."""

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
