"""The two tiers, the order they run in, and where the shared helpers are found.

tests/unit: no Ray, no process kills, no multi-process gloo runs (`make test-fast`).
tests/integration: Ray sweeps, kills and gloo ranks, each test marked `slow` (pytest-xdist
ordering and grouping go by marks, so a test's folder and its mark must agree).

The shared helper modules (helpers.py, sweeps.py, windows.py) and data/ lie here, beside the
tiers, and are imported by their plain names: this folder is put on sys.path here, before any
test module is imported, so that holds whatever the import mode, and in the processes
`run_ranks` spawns (they start with the parent's sys.path). Test modules have no __init__.py;
pytest imports each by its basename, so basenames are unique across the tree."""

import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

# One OpenMP thread a process, set before anything here imports torch: `make test` runs two
# pytest-xdist workers on two cores, and each worker's torch (and the CLI and Ray processes
# it starts, which inherit this) would otherwise spin up a thread per core beside the other
# worker's. Training itself is unaffected (it sets `TrainConfig.threads`, 1 by default); the
# unit tier took 83 CPU-s instead of 97 (49 s instead of 59 s of wall). A user's own setting
# is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# No Python workers started ahead of need by each Ray the tests start (Ray's
# `prestart_worker_first_driver`, which every raylet reads from its environment): a worker
# for each CPU, whether a task comes or not, is CPU taken from the test beside. A local sweep
# of two in-process trials took 15.0 CPU-s instead of 16.6 (five runs each) and half a second
# more of wall: on an idle machine Ray's default is the faster, and the product keeps it.
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")

#: tier folder -> whether its tests carry the `slow` mark.
SLOW_IN = {"unit": False, "integration": True}


def misplaced(item: pytest.Item) -> str | None:
    """Why `item` is in the wrong tier for its mark, or None."""
    where = Path(str(item.path)).resolve().relative_to(TESTS).parts[0]
    slow = item.get_closest_marker("slow") is not None
    if where not in SLOW_IN:
        return "outside tests/unit and tests/integration"
    if slow != SLOW_IN[where]:
        return f"in tests/{where} but {'' if slow else 'not '}marked slow"
    return None


def cost(item: pytest.Item) -> float:
    """The seconds `item` was measured to take (its `cost` mark), 0 if unmarked."""
    mark = item.get_closest_marker("cost")
    return float(mark.args[0]) if mark else 0.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The multi-process and Ray tests first, costliest first, so that two pytest-xdist workers
    (which take the next test, or the next group of tests, as each becomes free) end together:
    the longest test started last would run alone at the end. A group (`xdist_group`) runs on
    one worker, so it sorts by the sum of its tests' costs."""
    wrong = [f"{item.nodeid}: {why}" for item in items if (why := misplaced(item))]
    if wrong:
        raise pytest.UsageError(
            "tests in the wrong tier (slow tests go under tests/integration, the others under "
            "tests/unit):\n  " + "\n  ".join(wrong)
        )
    group_cost: dict[str, float] = {}
    for item in items:
        group = item.get_closest_marker("xdist_group")
        if group:
            group_cost[group.args[0]] = group_cost.get(group.args[0], 0.0) + cost(item)

    def unit_cost(item: pytest.Item) -> float:
        group = item.get_closest_marker("xdist_group")
        return group_cost[group.args[0]] if group else cost(item)

    items.sort(key=lambda item: (item.get_closest_marker("slow") is None, -unit_cost(item)))
