"""Fixtures shared across test modules."""

import pytest
from sweeps import FinishedSweep, finish_a_killed_sweep


@pytest.fixture(scope="session")
def finished_sweep(tmp_path_factory) -> FinishedSweep:
    """One real sweep for every test that reads or damages a finished one (each copies it).
    Its tests carry `sweeps.SHARES_THE_FINISHED_SWEEP`, so pytest-xdist (`--dist loadgroup`) runs
    them in one worker and the sweep is made once."""
    return finish_a_killed_sweep(tmp_path_factory.mktemp("finished"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The multi-process and Ray tests first, so that two pytest-xdist workers share them from
    the start and the quick tests fill in at the end (collection order is file order)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
