"""One searched key of a space: its distribution, the values it may take, and its corners
(the values a space's validation builds a training config at)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from schedule_search.core.config import STRICT

__all__ = ["Param"]


@dataclass
class Param:
    """One searched key. `low`/`high` for uniform, loguniform and int; `values` for choice."""

    __pydantic_config__ = STRICT

    type: Literal["uniform", "loguniform", "int", "choice"]
    low: float | None = None
    high: float | None = None
    log: bool = False
    values: list[Any] | None = None

    def __post_init__(self) -> None:
        if self.type == "choice":
            if not self.values:
                raise ValueError("values: a choice needs a non-empty list of values")
            if self.low is not None or self.high is not None:
                raise ValueError("low: a choice takes values, not low/high")
            return
        if self.values is not None:
            raise ValueError(f"values: only a choice takes values, not {self.type}")
        if self.low is None or self.high is None:
            raise ValueError(f"low: {self.type} needs both low and high")
        if not self.low < self.high:
            raise ValueError(f"high: must exceed low ({self.low}), got {self.high}")
        if (self.type == "loguniform" or self.log) and self.low <= 0:
            raise ValueError(f"low: a log scale needs low > 0, got {self.low}")
        if self.type == "int" and (self.low != int(self.low) or self.high != int(self.high)):
            raise ValueError(f"low: int bounds must be whole numbers, got {self.low}..{self.high}")

    def contains(self, value: Any) -> bool:
        """Whether `value` is one this param can take (a point to evaluate must be)."""
        if self.type == "choice":
            return value in (self.values or [])
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.type == "int" and value != int(value):
            return False
        return self.low <= value <= self.high  # type: ignore[operator]

    def describe(self) -> str:
        if self.type == "choice":
            return f"one of {self.values}"
        kind = "a whole number" if self.type == "int" else "a number"
        return f"{kind} in [{self.low:g}, {self.high:g}]"

    def corners(self) -> list[Any]:
        """The values that must all make a valid training config."""
        if self.type == "choice":
            return list(self.values or [])
        if self.type == "int":
            return [int(self.low), int(self.high)]  # type: ignore[arg-type]
        return [self.low, self.high]
