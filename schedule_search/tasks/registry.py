"""Which task a config names: a built-in one (`linreg`, `tinylm`, `hf_causal_lm`) or a user's
`package.module:factory`, built and checked against the protocol."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from schedule_search.core.config import ConfigError
from schedule_search.tasks.protocol import Task

__all__ = ["BUILTIN_TASKS", "build_task", "task_code"]


def _builtin(name: str) -> Callable[..., Task] | None:
    if name == "linreg":
        from schedule_search.tasks import linreg

        return linreg.build
    if name == "tinylm":
        from schedule_search.tasks import tinylm

        return tinylm.build
    if name == "hf_causal_lm":
        from schedule_search.tasks import hf_causal_lm

        return hf_causal_lm.build
    return None


BUILTIN_TASKS = ("linreg", "tinylm", "hf_causal_lm")


def build_task(spec: Mapping[str, Any], seed: int, source: str = "config") -> Task:
    """Build a task from a config section: `{name: <built-in>|module:factory, ...}`."""
    if not isinstance(spec, Mapping) or "name" not in spec:
        raise ConfigError(f"{source}: task.name: required key is missing")
    options = {k: v for k, v in spec.items() if k != "name"}
    name = spec["name"]
    builtin = _builtin(name) if isinstance(name, str) else None
    if builtin is not None:
        return builtin(options, seed=seed, source=source)
    factory = _import_factory(name, source)
    try:
        task = factory(seed=seed, **options)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{source}: task: {name} refused its options: {err}") from None
    if not isinstance(task, Task):
        raise ConfigError(f"{source}: task.name: {name} did not return a Task (see the protocol)")
    return task


def _import_factory(name: Any, source: str) -> Callable[..., Task]:
    expected = f"one of {', '.join(BUILTIN_TASKS)} or 'package.module:factory'"
    if not isinstance(name, str) or name.count(":") != 1:
        raise ConfigError(f"{source}: task.name: expected {expected}, got {name!r}")
    module_name, attribute = name.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(f"{source}: task.name: cannot import {module_name!r} ({err})") from None
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise ConfigError(f"{source}: task.name: {module_name} has no callable {attribute!r}")
    return factory


def task_code(spec: Mapping[str, Any]) -> Path | None:
    """Where a user's task module lives (its file, or its top-level package's folder), for Ray
    to ship to workers that do not have it (`runtime_env` `py_modules`); None for the built-in
    tasks and for modules installed in site-packages (install those on the cluster too)."""
    name = spec.get("name") if isinstance(spec, Mapping) else None
    if not isinstance(name, str) or name in BUILTIN_TASKS or ":" not in name:
        return None
    top = importlib.import_module(name.split(":")[0].split(".")[0])
    origin = getattr(top, "__file__", None)
    if origin is None:
        return None
    path = Path(origin).parent if Path(origin).name == "__init__.py" else Path(origin)
    if {"site-packages", "dist-packages"} & set(path.parts):
        return None
    return path
