"""What a space resolves to at launch (`SweepFacts`): its base config's budget, and its model
built once to count the parameters Chinchilla is measured in."""

from __future__ import annotations

import torch

from schedule_search.core.config import ConfigError
from schedule_search.store.facts import SweepFacts
from schedule_search.sweep.space import SearchSpace, trial_config
from schedule_search.tasks.protocol import Task
from schedule_search.tasks.registry import build_task

__all__ = ["resolve_facts"]


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
