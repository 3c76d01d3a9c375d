"""Experiments started before the package moved into subpackages pickled the old module
paths into their Tune state; unpickling them finds each name where it lives now."""

import pickle

import pytest

from schedule_search.sweep.experiment import SweepSettings
from schedule_search.sweep.recorder import TrialRecorder
from schedule_search.sweep.trial import SpaceTrials, run_trial
from schedule_search.transfer.run import PlannedRuns


def _global(module: str, name: str) -> bytes:
    """A pickle (protocol 0) of a reference to `module.name`, as an older version wrote it."""
    return f"c{module}\n{name}\n.".encode()


@pytest.mark.parametrize(
    "module, name, now",
    [
        ("schedule_search.search", "TrialRecorder", TrialRecorder),
        ("schedule_search.search", "SpaceTrials", SpaceTrials),
        ("schedule_search.search", "run_trial", run_trial),
        ("schedule_search.experiment", "SweepSettings", SweepSettings),
        ("schedule_search.transfer", "PlannedRuns", PlannedRuns),
    ],
)
def test_old_module_paths_resolve_to_where_the_names_live_now(module, name, now):
    assert pickle.loads(_global(module, name)) is now


def test_a_name_no_module_ever_had_is_still_an_error():
    with pytest.raises(AttributeError, match="'Nothing'"):
        pickle.loads(_global("schedule_search.search", "Nothing"))
