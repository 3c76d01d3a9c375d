"""The transfer study: the tuned recipe continued to longer horizons against references tuned
per horizon (plan: which runs; run: rounds of them under Ray Tune; launch: how it is
launched or resumed; lr_grid: grids that extend until their optimum is interior)."""

from typing import Any

#: The names older experiments' pickles ask of the module this package replaced.
_PICKLED = {"PlannedRuns"}


def __getattr__(name: str) -> Any:
    if name not in _PICKLED:  # a submodule not imported yet, or no such name
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from schedule_search._compat import moved_attribute

    return moved_attribute(__name__, name)
