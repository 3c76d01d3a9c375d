"""A SIGKILLed driver holds nothing: the kernel drops its flock, so a resume goes ahead, and
`status` no longer names it as at work (its text stays in the lock file)."""

import signal
import subprocess
import sys

import pytest

from schedule_search.core.config import ConfigError
from schedule_search.store.experiment import Experiment, SweepSettings
from schedule_search.store.lock import experiment_lock, lock_holder


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
        assert lock_holder(experiment.root).startswith(f"`sweep` by pid {holder.pid} since ")
        with (
            pytest.raises(ConfigError, match="already running"),
            experiment_lock(experiment.root, "resume"),
        ):
            pass
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        assert f"pid {holder.pid}" in (experiment.root / ".lock").read_text()
        assert lock_holder(experiment.root) is None
        with experiment_lock(experiment.root, "resume"):
            pass
    finally:
        holder.kill()
