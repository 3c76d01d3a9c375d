"""Fixtures of the integration tier."""

import pytest
from sweeps import FinishedSweep, finish_a_killed_sweep


@pytest.fixture(scope="session")
def finished_sweep(tmp_path_factory) -> FinishedSweep:
    """One real sweep for every test that reads or damages a finished one (each copies it).
    Its tests carry `sweeps.SHARES_THE_FINISHED_SWEEP`, so pytest-xdist (`--dist loadgroup`) runs
    them in one worker and the sweep is made once."""
    return finish_a_killed_sweep(tmp_path_factory.mktemp("finished"))
