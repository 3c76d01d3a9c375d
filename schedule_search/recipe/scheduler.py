"""The recipe's schedule as a torch `LRScheduler`, for the trainers that take one (Hugging Face
Trainer, Lightning, torchtitan, Composer, a plain loop with `scheduler.step()`).

The schedule lives on the token clock: the LR of optimizer step k (0-based, the one after k
calls to `scheduler.step()`) is `peak_lr * lr_multiplier(clock(k * tokens_per_step))`, the LR
the sweep's own loop gives a window that starts after the same tokens. So a user who trains
with another batch size passes its `tokens_per_step` and every token still sees the LR it saw
in the sweep. Param groups keep their ratio to the optimizer's default LR (`group_lrs`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from schedule_search.core.clock import TokenClock
from schedule_search.core.window import group_lrs

__all__ = ["RecipeLRScheduler"]

#: Attributes rebuilt from the recipe, not saved: a checkpoint holds numbers, not code.
_FROM_THE_RECIPE = ("optimizer", "_schedule", "_token_clock")


class RecipeLRScheduler(LRScheduler):
    """LR at step k: `peak_lr * schedule(token_clock.steps(k * tokens_per_step))` for the
    default group, the same ratio for the others. Built by `Recipe.lr_scheduler`."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        schedule: Callable[[float], float],
        token_clock: TokenClock,
        peak_lr: float,
        tokens_per_step: float,
        last_epoch: int = -1,
    ) -> None:
        if not (isinstance(tokens_per_step, int | float) and tokens_per_step > 0):
            raise ValueError(
                "tokens_per_step: expected the tokens in one optimizer step (batch size x "
                f"sequence length x gradient accumulation x ranks), got {tokens_per_step!r}"
            )
        self.peak_lr = float(peak_lr)
        self.tokens_per_step = float(tokens_per_step)
        self._schedule = schedule
        self._token_clock = token_clock
        super().__init__(optimizer, last_epoch)

    @property
    def tokens_seen(self) -> float:
        """Tokens before the next optimizer step: the steps taken times `tokens_per_step`."""
        return self.last_epoch * self.tokens_per_step

    @property
    def t(self) -> float:
        """The recipe's clock (reference steps) at the next optimizer step."""
        return self._token_clock.steps(self.tokens_seen)

    def get_lr(self) -> list[float | torch.Tensor]:
        return list(group_lrs(self.optimizer, self.peak_lr * self._schedule(self.t)))

    def state_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in _FROM_THE_RECIPE}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the step count; refused (neither value silently winning) when the checkpoint
        was saved with another `tokens_per_step` or `peak_lr` (a recipe edited since), either
        of which would move every later LR."""
        for name in ("tokens_per_step", "peak_lr"):
            saved, ours = state_dict.get(name), getattr(self, name)
            if saved is not None and float(saved) != ours:
                raise ValueError(
                    f"{name}: this scheduler has {ours!r}, the checkpoint was saved with "
                    f"{float(saved)!r}"
                )
        self.__dict__.update({k: v for k, v in state_dict.items() if k not in _FROM_THE_RECIPE})
