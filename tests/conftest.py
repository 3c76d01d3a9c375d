"""Fixtures shared across test modules."""

import pytest
from sweeps import FinishedSweep, finish_a_killed_sweep


@pytest.fixture(scope="session")
def finished_sweep(tmp_path_factory) -> FinishedSweep:
    """One real sweep for every test that reads or damages a finished one (each copies it)."""
    return finish_a_killed_sweep(tmp_path_factory.mktemp("finished"))


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`--dist loadgroup`), the tests of one session fixture run in one
    worker, so the sweep it makes is made once."""
    for item in items:
        if "finished_sweep" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("finished_sweep"))
