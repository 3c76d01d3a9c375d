"""The module paths of earlier versions, for what they left on disk.

Ray Tune pickles a sweep's trainable, callbacks and searcher into the experiment's `tune/`
folder by module path, and a transfer's planned runs too. Experiments started before the
package was split into subpackages (2026-12) name the old flat modules; `resume` and
`transfer` of such an experiment find those names here, in the modules they moved to.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

__all__ = ["MOVED", "install", "moved_attribute"]

_SWEEP = "schedule_search.sweep"
#: old module -> the modules its names live in now, searched in order.
MOVED: dict[str, tuple[str, ...]] = {
    "schedule_search.search": tuple(
        f"{_SWEEP}.{m}" for m in ("driver", "trial", "recorder", "searcher", "ray_env")
    ),
    "schedule_search.ray_session": (f"{_SWEEP}.worker",),
    "schedule_search.progress": (f"{_SWEEP}.live_view",),
    "schedule_search.failures": (f"{_SWEEP}.failures",),
    "schedule_search.experiment": (f"{_SWEEP}.experiment",),
    "schedule_search.space": (f"{_SWEEP}.space",),
    "schedule_search.optuna_study": (f"{_SWEEP}.optuna_study",),
    "schedule_search.records": (f"{_SWEEP}.records",),
    "schedule_search.transfer_plan": ("schedule_search.transfer.plan",),
    # Now a package of the same name: its `__getattr__` asks `moved_attribute`.
    "schedule_search.transfer": ("schedule_search.transfer.run",),
}


def moved_attribute(old_module: str, name: str) -> Any:
    """`name` of `old_module`, from the module it lives in now."""
    for home in MOVED[old_module]:
        module = importlib.import_module(home)
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"module {old_module!r} has no attribute {name!r}")


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old flat module as a stand-in whose names resolve where they live now."""

    def find_spec(
        self, fullname: str, path: Any = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in MOVED:  # only asked when no real module of that name exists
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return types.ModuleType(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        old = module.__name__
        module.__getattr__ = lambda name: moved_attribute(old, name)  # type: ignore[method-assign]


def install() -> None:
    """Put the finder after the normal ones (a real module of an old name always wins)."""
    if not any(isinstance(finder, _OldPaths) for finder in sys.meta_path):
        sys.meta_path.append(_OldPaths())
