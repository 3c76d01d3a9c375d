"""What a sweep's space resolves to, worked out once when the sweep is launched
(`sweep.resolve`) and written beside it (`facts.json`). Every later reader (`resume`,
`status`, `export`, `report`, `transfer`) takes the objective's horizon and the evaluation
points from here: none of them re-derives them from the space or builds the task, so none
needs the task's code or data.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

from pydantic import Field

from schedule_search.core.config import STRICT, ConfigError, parse
from schedule_search.core.files import atomic_write_text

__all__ = ["FACTS_FILE", "SweepFacts", "read_facts", "write_facts"]

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
    n_params: Annotated[int, Field(ge=0)]
    tokens_per_reference_step: Annotated[float, Field(ge=0)]

    def check_beyond(self, horizons: list[float], flag: str = "--to") -> None:
        """`flag` names horizons past this sweep's; one short of it would be planned (a
        transfer to 2x of a 4x sweep) or dropped (a forecast) without a word."""
        for horizon in horizons:
            if horizon < self.horizon:
                raise ConfigError(
                    f"{flag}: expected horizons at or beyond the sweep's {self.horizon:g}x, "
                    f"got {horizon:g}"
                )


def write_facts(root: Path, facts: SweepFacts) -> None:
    atomic_write_text(root / FACTS_FILE, json.dumps(asdict(facts), indent=1))


def read_facts(root: Path) -> SweepFacts:
    """The facts the launch wrote; a missing or damaged file is a one-line ConfigError."""
    path = root / FACTS_FILE
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: unreadable sweep facts ({err})") from None
    return parse(SweepFacts, recorded, str(path))
