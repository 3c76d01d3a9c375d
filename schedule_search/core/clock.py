"""One clock for everything: tokens seen, expressed in reference steps and Chinchilla multiples.

Schedules and EMAs read `t = tokens / tokens_per_reference_step`, never a count of optimizer
steps or micro-batches, so a variable number of tokens per update (time windows) keeps them
right. Chinchilla multiples are converted to tokens here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TokenClock"]


@dataclass(frozen=True)
class TokenClock:
    """Converts Chinchilla multiples to tokens and reference steps for one model size."""

    n_params: int
    tokens_per_param: float
    tokens_per_reference_step: float

    @property
    def chinchilla_tokens(self) -> float:
        """Tokens in 1x Chinchilla: tokens_per_param * non-embedding parameters."""
        return self.tokens_per_param * self.n_params

    @property
    def steps_per_chinchilla(self) -> float:
        return self.chinchilla_tokens / self.tokens_per_reference_step

    def tokens(self, multiple: float) -> int:
        return round(multiple * self.chinchilla_tokens)

    def steps(self, tokens: float) -> float:
        """The clock t (reference steps) after `tokens` tokens."""
        return tokens / self.tokens_per_reference_step
