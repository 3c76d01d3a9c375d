"""What a sweep's space resolves to, worked out once when the sweep is launched and written
beside it (`facts.json`). Every later reader (`resume`, `status`, `export`, `report`,
`transfer`) takes the objective's horizon and the evaluation points from here: none of them
re-derives them from the space or builds the task, so none needs the task's code or data.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import torch
from pydantic import Field

from schedule_search.core.config import STRICT, ConfigError, parse
from schedule_search.core.files import atomic_write_text
from schedule_search.sweep.records import read_records
from schedule_search.sweep.space import SearchSpace, load_space, trial_config
from schedule_search.tasks.protocol import Task
from schedule_search.tasks.registry import build_task

__all__ = ["FACTS_FILE", "SweepFacts", "read_facts", "resolve_facts", "write_facts"]

FACTS_FILE = "facts.json"


@dataclass
class SweepFacts:
    """The resolved facts of a sweep: the objective's horizon and the evaluation points (in
    Chinchilla multiples) and tokens per parameter of 1x; the parameter count 1x is measured
    in and the clock's unit (tokens per reference step) of the base config's model. A space
    that searches `task.*` keys has trials of other sizes: each trial's own evaluations
    record its own (`Evaluation.n_params`), and `export` and `transfer` read those."""

    __pydantic_config__ = STRICT

    horizon: Annotated[float, Field(gt=0)]
    milestones: list[float]
    tokens_per_param: Annotated[float, Field(gt=0)]
    n_params: Annotated[int, Field(ge=0)]  # 0: unknown (a sweep from before facts.json)
    tokens_per_reference_step: Annotated[float, Field(ge=0)]


def resolve_facts(space: SearchSpace, source: str) -> SweepFacts:
    """Build the space's task and its model once, to count its parameters: on the meta device
    (no weights allocated, so a large model costs nothing), or on the CPU for a task whose
    `build_model` needs real tensors (loads weights, reads data)."""
    base = trial_config(space, {}, source)
    task = build_task(base.task, base.seed, source)
    return SweepFacts(
        horizon=base.budget.horizon,
        milestones=base.budget.milestones(),
        tokens_per_param=base.budget.tokens_per_param,
        n_params=_count_params(task, source),
        tokens_per_reference_step=float(
            base.budget.tokens_per_reference_step or task.tokens_per_microbatch
        ),
    )


def _count_params(task: Task, source: str) -> int:
    try:
        with torch.device("meta"):
            return int(task.chinchilla_params(task.build_model()))
    except Exception:  # a model that cannot be built without data: build it for real
        pass
    try:
        return int(task.chinchilla_params(task.build_model()))
    except Exception as err:
        raise ConfigError(f"{source}: task: its model could not be built ({err})") from None


def write_facts(root: Path, facts: SweepFacts) -> None:
    atomic_write_text(root / FACTS_FILE, json.dumps(asdict(facts), indent=1))


def read_facts(root: Path) -> SweepFacts:
    """The facts the launch wrote; a damaged file is a one-line ConfigError. A sweep launched
    before facts.json existed has its facts derived from its own copy of the space and its
    trials' records (never from the task: see `_derived`)."""
    path = root / FACTS_FILE
    try:
        recorded = json.loads(path.read_text())
    except FileNotFoundError:
        return _derived(root)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: unreadable sweep facts ({err})") from None
    return parse(SweepFacts, recorded, str(path))


def _derived(root: Path) -> SweepFacts:
    """Facts of a sweep from before facts.json: the budget from `space.yaml`, the model's size
    and clock unit from the first trial that evaluated (0 while none has; `resume` writes the
    file from the task itself)."""
    space_file = root / "space.yaml"
    if not space_file.is_file():
        raise ConfigError(f"{root / FACTS_FILE}: not found, and no space.yaml beside it")
    budget = trial_config(load_space(space_file, check_task=False), {}).budget
    evaluated = (read_records(trial).history for trial in sorted(root.glob("trials/*")))
    first = next((history[0] for history in evaluated if history), None)
    return SweepFacts(
        horizon=budget.horizon,
        milestones=budget.milestones(),
        tokens_per_param=budget.tokens_per_param,
        n_params=first.n_params if first else 0,
        tokens_per_reference_step=first.tokens_per_reference_step if first else 0.0,
    )
