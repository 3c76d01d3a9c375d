"""The local Ray a sweep starts keeps its State API where it told its processes it would be,
even when the chosen dashboard port is taken between choosing it and Ray binding it (Ray then
runs without a dashboard, and Ray Train never frees a stopped trial's workers)."""

import os
import socket

import pytest
from ray.util.state import list_nodes

from schedule_search.store.experiment import SweepSettings
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
    settings = SweepSettings(name="x", samples=1, workers=1, concurrency=1)
    with taken, ray_env.ray_session(settings, {"name": "linreg"}, tmp_path):
        address = os.environ["RAY_API_SERVER_ADDRESS"]
        assert chosen[0] == taken_port and len(chosen) == 2, chosen
        assert address == f"http://127.0.0.1:{chosen[1]}"
        # The State API answers at the address every process of this Ray inherited.
        assert len(list_nodes(address=address)) == 1
