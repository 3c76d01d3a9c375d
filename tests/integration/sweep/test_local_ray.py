"""The local Ray a sweep of worker-group trials starts keeps its State API where it told its
processes it would be, even when the chosen dashboard port is taken between choosing it and
Ray binding it (Ray then runs without a dashboard, and Ray Train never frees a stopped trial's
workers). A sweep of in-process trials starts its Ray without a dashboard. A Ray that cannot
start ends the sweep in one line, its folder kept for `resume`."""

import os
import socket
from pathlib import Path

import pytest
from ray.util.state import list_nodes
from sweeps import SPACE, cli_in_process, write_space

from schedule_search.store.experiment import Experiment, SweepSettings
from schedule_search.sweep import ray_env
from schedule_search.train.launch import free_port


@pytest.mark.slow
@pytest.mark.cost(12)
@pytest.mark.timeout(300)
def test_a_dashboard_port_taken_before_ray_binds_it_starts_ray_on_another(tmp_path, monkeypatch):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()  # another program's server, there before Ray's dashboard
    taken_port = taken.getsockname()[1]
    chosen = []

    def first_the_taken_port() -> int:
        chosen.append(taken_port if not chosen else free_port())
        return chosen[-1]

    monkeypatch.setattr(ray_env, "free_port", first_the_taken_port)
    settings = SweepSettings(name="x", samples=1, workers=2, concurrency=1)
    with taken, ray_env.ray_session(settings, {"name": "linreg"}, tmp_path):
        address = os.environ["RAY_API_SERVER_ADDRESS"]
        assert chosen[0] == taken_port and len(chosen) == 2, chosen
        assert address == f"http://127.0.0.1:{chosen[1]}"
        # The State API answers at the address every process of this Ray inherited.
        assert len(list_nodes(address=address)) == 1


def dashboard_modules_started_here() -> list[bytes]:
    """The command lines of the dashboard's module processes (`ray-dashboard-<Module>-0`) among
    this process's descendants: a local Ray's processes are its children."""
    parents, commands = {}, {}
    for entry in Path("/proc").iterdir():
        try:
            stat, command = (entry / "stat").read_text(), (entry / "cmdline").read_bytes()
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            commands[int(entry.name)] = command
        except (OSError, ValueError, IndexError):  # not a process, or it ended while we looked
            continue

    def descends(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == os.getpid():
                return True
        return False

    return [c for pid, c in commands.items() if c.startswith(b"ray-dashboard-") and descends(pid)]


@pytest.mark.slow
@pytest.mark.cost(8)
@pytest.mark.timeout(300)
def test_a_ray_for_in_process_trials_starts_without_the_dashboards_modules(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    for workers in (1, 2):
        settings = SweepSettings(name="x", samples=1, workers=workers, concurrency=1)
        assert settings.in_process == (workers == 1)
        with ray_env.ray_session(settings, {"name": "linreg"}, tmp_path):
            modules = dashboard_modules_started_here()
            # With a dashboard: its State API among them (Ray Train's cleaner asks it).
            assert any(b"StateHead" in c for c in modules) == (workers == 2), modules
            assert not modules or workers == 2, modules
            assert ("RAY_API_SERVER_ADDRESS" in os.environ) == (workers == 2)


@pytest.mark.slow
@pytest.mark.cost(15)
@pytest.mark.timeout(300)
def test_a_local_ray_that_cannot_start_ends_the_sweep_in_one_line_and_resume_runs_it(
    tmp_path, monkeypatch, capfd
):
    # Ray's temporary folder under a path so long that its sockets' paths pass the 107 bytes
    # an AF_UNIX address holds (a cluster's scratch folder can be): Ray refuses to start.
    long_tmp = tmp_path / ("t" * (110 - len(str(tmp_path))))
    long_tmp.mkdir()
    monkeypatch.setenv("RAY_TMPDIR", str(long_tmp))
    variables = [*ray_env.AUTH_VARIABLES, "RAY_API_SERVER_ADDRESS"]
    before = {name: os.environ.get(name) for name in variables}
    base = SPACE["base"] | {"budget": {"horizon": 1.0, "eval_at": [0.5]}}
    space = write_space(tmp_path, samples=1, scheduler="fifo", base=base)
    storage = tmp_path / "runs"
    # Refused before Ray ran a process: in this process, which it leaves as it was.
    args = ["sweep", str(space), "--workers", "1", "--storage", str(storage)]
    failed = cli_in_process(capfd, *args)
    assert failed.returncode == 1, failed.stderr[-3000:]
    lines = failed.stderr.strip().splitlines()
    assert len(lines) == 1, failed.stderr[-3000:]
    assert lines[0].startswith("sweep ended: the local Ray could not start: OSError: "), lines
    assert "AF_UNIX path length" in lines[0], lines[0]
    assert lines[0].endswith(f"resume lin --storage {storage}` continues it")
    assert {name: os.environ.get(name) for name in variables} == before  # put back
    experiment = Experiment(storage / SPACE["name"])
    assert experiment.settings().samples == 1 and experiment.trial_ids() == []

    monkeypatch.delenv("RAY_TMPDIR")
    resumed = cli_in_process(capfd, "resume", SPACE["name"], "--storage", str(storage))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [row.state for row in experiment.rows()] == ["completed"]
