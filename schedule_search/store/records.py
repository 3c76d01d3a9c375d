"""A trial's records (`trials/<id>/config.json`, `metrics.json`, `result.json`), read and checked.

Every record is written atomically, so a record that does not parse, or parses into the wrong
shape, was damaged from outside (a full disk, an editor, a copy cut short). Such a trial is
named in one line and never ranked: guessing around a damaged record (a truncated result read
as "running", a garbage config read as "no params") silently changes what `export` picks.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedule_search.core.config import ConfigError, parse
from schedule_search.core.states import ENDINGS
from schedule_search.train.config import TrainConfig
from schedule_search.train.evaluation import Evaluation

#: The name of a trial's objective in its results: what the searcher minimizes and ranks.
METRIC = "val_loss"

__all__ = ["METRIC", "CorruptRecord", "TrialRecords", "read_records"]


class CorruptRecord(Exception):
    """A record that exists but cannot be what the sweep wrote; `str()` is the one line."""


@dataclass
class TrialRecords:
    """What the sweep recorded of one trial; `problem` names the first damaged record."""

    config: dict[str, Any] = field(default_factory=dict)
    history: list[Evaluation] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None

    @property
    def params(self) -> dict[str, Any]:
        return self.config.get("params", {})


def read_records(trial_dir: Path) -> TrialRecords:
    """The trial's records; a missing metrics or result record is a trial not yet that far,
    a damaged one sets `problem` (and is left out)."""
    records = TrialRecords()
    for name, check in (
        ("config.json", _check_config),
        ("metrics.json", _evaluations),
        ("result.json", _check_result),
    ):
        path = trial_dir / name
        try:
            value = _read(path)
            if value is not None:
                setattr(records, _FIELD[name], check(value))
        except CorruptRecord as err:
            records.problem = f"{path}: {err}"
            return records
    return records


_FIELD = {"config.json": "config", "metrics.json": "history", "result.json": "result"}


def _read(path: Path) -> Any:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise CorruptRecord(f"unreadable ({err.__class__.__name__})") from None
    try:
        return json.loads(text)
    except ValueError as err:
        raise CorruptRecord(f"not valid JSON ({err})") from None


def _check_config(record: Any) -> dict[str, Any]:
    if not isinstance(record, dict) or not isinstance(record.get("params"), dict):
        raise CorruptRecord("expected {params: {...}, config: {...}}")
    try:
        parse(TrainConfig, record.get("config"), "config")
    except ConfigError as err:
        raise CorruptRecord(f"not a training config ({err})") from None
    return record


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _evaluations(history: Any) -> list[Evaluation]:
    if not isinstance(history, list):
        raise CorruptRecord("expected a list of evaluations")
    evaluations = []
    for i, row in enumerate(history):
        if not isinstance(row, dict) or not all(
            _number(row.get(key)) for key in ("chinchilla", "tokens", "val_loss")
        ):
            raise CorruptRecord(f"evaluation {i} lacks chinchilla, tokens or val_loss")
        if not math.isfinite(row["chinchilla"]) or row["chinchilla"] < 0:
            raise CorruptRecord(f"evaluation {i}: chinchilla {row['chinchilla']!r}")
        try:
            evaluations.append(Evaluation.from_metrics(row))
        except (TypeError, ValueError) as err:
            raise CorruptRecord(f"evaluation {i}: {err}") from None
    return evaluations


def _check_result(result: Any) -> dict[str, Any]:
    if not isinstance(result, dict) or result.get("state") not in ENDINGS:
        raise CorruptRecord(f"expected a state among {', '.join(map(str, ENDINGS))}")
    return result
