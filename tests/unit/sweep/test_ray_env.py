"""The Ray session a sweep runs in leaves this process's environment as it found it, also
when Ray refuses to start (a notebook or a test that starts another Ray afterwards must not
look for this one's State API, token or console settings)."""

import os

import pytest

from schedule_search.store.experiment import SweepSettings
from schedule_search.sweep.ray_env import (
    AUTH_VARIABLES,
    DRIVER_ONLY_ENVIRONMENT,
    RayNotStarted,
    ray_session,
)

SET_BY_A_SESSION = ["RAY_API_SERVER_ADDRESS", *DRIVER_ONLY_ENVIRONMENT, *AUTH_VARIABLES]


def test_a_session_ray_refuses_to_start_leaves_the_environment_as_it_was(tmp_path, monkeypatch):
    for name in SET_BY_A_SESSION:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # the user's own, to be kept
    before = {name: os.environ.get(name) for name in SET_BY_A_SESSION}
    refused = SweepSettings(name="x", samples=1, workers=1, concurrency=-1)  # ray.init refuses
    with (
        pytest.raises(RayNotStarted, match=r"local Ray could not start: ValueError: .*nonnegative"),
        ray_session(refused, {"name": "linreg"}, tmp_path),
    ):
        pass  # not reached
    assert {name: os.environ.get(name) for name in SET_BY_A_SESSION} == before
    assert not (tmp_path / "ray_token").exists()
