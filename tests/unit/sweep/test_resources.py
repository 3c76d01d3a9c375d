"""A trial's needs against what the machine or cluster has: the default number of trials at
once, and the one-line refusal of a trial that cannot fit (both before anything launches)."""

import pytest

from schedule_search.core.config import ConfigError
from schedule_search.store.experiment import SweepSettings
from schedule_search.sweep.resources import check_resources, default_concurrency


def settings(workers: int, gpus_per_worker: float = 0.0, cpus_per_worker: float = 1.0):
    return SweepSettings(
        name="s",
        samples=8,
        workers=workers,
        concurrency=1,
        gpus_per_worker=gpus_per_worker,
        cpus_per_worker=cpus_per_worker,
    )


@pytest.mark.parametrize(
    ("trial", "has", "expected"),
    [
        (settings(2), {"CPU": 2.0, "GPU": 0.0}, 1),  # this machine: one 2-worker trial
        (settings(2), {"CPU": 64.0, "GPU": 0.0}, 32),  # a cluster's CPUs, not the head's
        (settings(1), {"CPU": 3.0, "GPU": 0.0}, 3),
        (settings(2, cpus_per_worker=2.0), {"CPU": 9.0, "GPU": 0.0}, 2),
        (settings(2, gpus_per_worker=1.0), {"CPU": 64.0, "GPU": 8.0}, 4),  # GPUs bound it
        (settings(4), {"CPU": 2.0, "GPU": 0.0}, 1),  # refused by check_resources, not 0
    ],
)
def test_default_concurrency_is_what_the_resources_hold(trial, has, expected):
    assert default_concurrency(trial, has) == expected


def test_a_trial_that_cannot_fit_is_one_line_naming_the_flag():
    with pytest.raises(ConfigError) as refused:
        check_resources(settings(2, gpus_per_worker=1.0), {"CPU": 64.0, "GPU": 1.0})
    assert str(refused.value) == (
        "--gpus-per-worker: a trial of 2 workers x 1 GPU needs 2 GPUs; this machine has 1"
    )
    check_resources(settings(2, gpus_per_worker=1.0), {"CPU": 64.0, "GPU": 2.0})  # fits
