"""The experiment lock: a second driver is refused in one line, and a killed holder holds
nothing."""

import signal
import subprocess
import sys

from schedule_search.cli import main
from schedule_search.sweep.experiment import Experiment, SweepSettings
from schedule_search.sweep.lock import experiment_lock


def test_a_second_driver_is_refused_and_a_dead_one_holds_nothing(tmp_path, capsys):
    experiment = Experiment(tmp_path / "runs" / "x")
    experiment.root.mkdir(parents=True)
    experiment.save_settings(SweepSettings(name="x", samples=1, workers=1, concurrency=1))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path\n"
            "from schedule_search.sweep.lock import experiment_lock\n"
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
