"""A SIGKILLed driver holds nothing: the kernel drops its flock, so a resume goes ahead."""

import signal
import subprocess
import sys

import pytest

from schedule_search.core.config import ConfigError
from schedule_search.store.experiment import Experiment, SweepSettings
from schedule_search.store.lock import experiment_lock


@pytest.mark.slow
@pytest.mark.cost(3)
def test_a_killed_holder_holds_nothing(tmp_path):
    experiment = Experiment(tmp_path / "runs" / "x")
    experiment.root.mkdir(parents=True)
    experiment.save_settings(SweepSettings(name="x", samples=1, workers=1, concurrency=1))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from pathlib import Path\n"
            "from schedule_search.store.lock import experiment_lock\n"
            f"with experiment_lock(Path({str(experiment.root)!r}), 'sweep'):\n"
            "    print('held', flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with (
            pytest.raises(ConfigError, match="already running"),
            experiment_lock(experiment.root, "resume"),
        ):
            pass
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        with experiment_lock(experiment.root, "resume"):
            pass
    finally:
        holder.kill()
