"""Time-windowed gradient accumulation across data-parallel ranks.

A window is the set of micro-batches between two optimizer steps, on all ranks together.

How it stays correct and cheap:
- Ranks never wait for each other inside a window: every close decision is local. A rank
  closes after `microbatches` micro-batches, once it holds its share of `tokens`, once its
  own clock (restarted when the previous close returned on it) has spent `seconds`, or
  (`grad_norm`) after the length the previous close chose for this window. Ranks may
  contribute different numbers of micro-batches; the one collective is the close.
- Each parameter's `.grad` is a view into a flat bucket (`reduction`), so backward
  accumulates in place and the close reduces whole buckets, overlapped with the last
  backward or compressed with error feedback. A float64 control vector (tokens, micro-batches,
  the loss sum, gradient-noise statistics) is all-reduced with them and stays exact.
- The loss is summed over tokens; the close divides the summed gradient by the *global* token
  count, so the step uses the big-batch gradient of the mean token loss over the micro-batches
  each rank actually did. Clipping comes after that normalization.
- Deterministic (the same data gives the same windows): `microbatches`, `tokens` (quotas
  follow the data) and `grad_norm` (its lengths come from reduced, identical statistics).
  `seconds` follows the wall clock.
- Autograd graphs are freed after every backward (no `retain_graph`): memory does not grow
  with the window. `optimizer.step()` does not zero gradients; `close` does, explicitly.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Annotated, Literal

import torch
import torch.distributed as dist
from pydantic import Field

from schedule_search.core.config import STRICT, Positive, PositiveInt
from schedule_search.core.reduction import (
    Compression,
    Gradients,
    ReplicatedGradients,
    distributed,
)

__all__ = [
    "WindowAccumulator",
    "WindowConfig",
    "WindowRecord",
    "estimated_snr",
    "group_lrs",
]


@dataclass
class WindowConfig:
    """When a window closes, how its gradient travels, and how it is clipped.

    policy: `microbatches` closes each rank after `microbatches` micro-batches; `tokens` once
    a rank holds its share of `tokens` (the total over ranks: tokens / world size each, the
    first `tokens % world` ranks one more); `seconds` once a rank's own clock has spent
    `seconds` in the window (the practitioner's 5-minute window); `grad_norm` after a length
    in micro-batches chosen at the previous close so that the window's estimated
    signal-to-noise ratio reaches `snr` (the first window is `min_microbatches` long: fewer
    give too noisy an estimate). `max_microbatches` caps every policy so a window always ends.

    overlap: reduce buckets of `bucket_mb` MB during the last backward (DDP's overlap; not with
    `grad_norm`, which needs the last local gradient, nor compression); 4 MB measured best.
    compression: `bf16` or `int8` (a scale per bucket) with error feedback; `none` is exact.
    """

    __pydantic_config__ = STRICT

    policy: Literal["microbatches", "tokens", "seconds", "grad_norm"] = "microbatches"
    microbatches: PositiveInt = 1
    tokens: PositiveInt = 65536
    seconds: Positive = 300.0
    snr: Positive = 1.0
    min_microbatches: Annotated[int, Field(ge=2)] = 4
    max_microbatches: PositiveInt = 1024
    clip_norm: Positive | None = 1.0
    overlap: bool = True
    bucket_mb: Positive = 4.0
    compression: Compression = "none"

    def __post_init__(self) -> None:
        # The cap ends every window; a window asked to be longer would be cut short silently.
        if self.policy == "microbatches" and self.microbatches > self.max_microbatches:
            raise ValueError(
                f"microbatches: {self.microbatches} exceeds max_microbatches "
                f"({self.max_microbatches}), which caps every window; raise it to mean this"
            )
        if self.policy == "grad_norm" and self.min_microbatches > self.max_microbatches:
            raise ValueError(
                f"min_microbatches: {self.min_microbatches} exceeds max_microbatches "
                f"({self.max_microbatches})"
            )


@dataclass(frozen=True)
class WindowRecord:
    """What one window did; rank 0 logs one per window."""

    index: int
    wall_time: float
    seconds: float
    microbatches: int
    tokens: int
    loss: float
    grad_norm: float
    lr: float
    tokens_per_s: float
    stepped: bool

    def to_dict(self) -> dict:
        return asdict(self)


# Slots of the control vector (summed over ranks at the close).
# _RANK_TOKENS_SQ: sum over ranks of N_r^2; _MICROBATCH_TOKENS_SQ: sum over micro-batches of
# n_i^2; _NOISE_TOKENS: the tokens the noise statistics cover.
(
    _TOKENS,
    _MICROBATCHES,
    _LOSS,
    _SQ_INCREMENTS,
    _SQ_SUM,
    _RANK_TOKENS_SQ,
    _MICROBATCH_TOKENS_SQ,
    _NOISE_TOKENS,
) = range(8)
_CONTROL_SIZE = 8


def estimated_snr(control: torch.Tensor) -> float:
    """Signal-to-noise ratio of the window's mean gradient, from micro-batch statistics.

    Model: a micro-batch of n tokens has gradient sum g = n G + noise with E|noise|^2 = n s2.
    With Q1 = sum |g_i|^2 over micro-batches and Q2 = sum over ranks |S_r|^2 (S_r: a rank's
    accumulated sum, N_r its tokens), E[Q2 - Q1] = |G|^2 (sum N_r^2 - sum n_i^2), which gives
    |G|^2 and then s2 from Q1. The SNR of the mean over N tokens is N |G|^2 / s2. Needs two
    micro-batches on some rank; NaN before that.
    """
    q1, q2 = float(control[_SQ_INCREMENTS]), float(control[_SQ_SUM])
    big, small, n = (
        float(control[_RANK_TOKENS_SQ]),
        float(control[_MICROBATCH_TOKENS_SQ]),
        float(control[_NOISE_TOKENS]),
    )
    if big - small <= 0 or n <= 0:
        return math.nan
    signal = max((q2 - q1) / (big - small), 0.0)
    noise = (q1 - signal * small) / n
    if noise <= 0:
        return math.inf
    return n * signal / noise


def group_lrs(optimizer: torch.optim.Optimizer, lr: float) -> list[float]:
    """Each param group's LR when the schedule gives `lr` for the optimizer's default group:
    a group built at 0.1x the default LR (its `initial_lr`, the key torch's LR schedulers
    set) steps at 0.1 * lr, so a schedule moves every group and keeps their ratios."""
    default = float(optimizer.defaults.get("lr", 0.0))
    return [
        lr * (float(group["initial_lr"]) / default if default > 0 else 1.0)
        for group in optimizer.param_groups
    ]


class WindowAccumulator:
    """Accumulates micro-batches into windows and takes one optimizer step per window.

    The loop, on every rank::

        last = window.begin_microbatch(n_tokens)   # this rank's own decision, no collective
        window.backward(loss_sum)                  # loss summed (not averaged) over tokens
        if last:
            record = window.close(lr)              # all-reduce, normalize, clip, step, zero

    Built without `gradients` (a replicated model), it first broadcasts rank 0's parameters
    to every rank (`ReplicatedGradients.synchronized`), so every rank must build it.
    """

    # The window in progress, set by `_start_window` at the start and at every close.
    _control: torch.Tensor
    _loss: torch.Tensor
    _ticks: int
    _pending_tokens: int
    _window_start: float
    _tick_start: float | None

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        optimizer: torch.optim.Optimizer,
        config: WindowConfig,
        group: dist.ProcessGroup | None = None,
        wall_clock: Callable[[], float] = time.monotonic,
        gradients: Gradients | None = None,
    ) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.optimizer = optimizer
        self.config = config
        self.group = group
        self.wall_clock = wall_clock
        self.rank, self.world_size = distributed(group)
        # NCCL reduces only CUDA tensors; gloo (and one process) keeps the control on the CPU.
        nccl = self.world_size > 1 and dist.get_backend(group) == "nccl"
        self._control_device = self.params[0].device if nccl else torch.device("cpu")
        self._track_noise = config.policy == "grad_norm"
        self._gradients = gradients or ReplicatedGradients.synchronized(
            self.params,
            group,
            config.bucket_mb,
            config.overlap,
            config.compression,
            self._track_noise,
        )
        # Share of the `tokens` policy's total; the `grad_norm` policy's current length.
        self._quota = config.tokens // self.world_size + int(
            self.rank < config.tokens % self.world_size
        )
        self.length = config.min_microbatches
        for param_group in optimizer.param_groups:  # torch's LR schedulers use the same key
            param_group.setdefault("initial_lr", param_group["lr"])
        self.tokens_seen = 0
        self.windows = 0
        self.local_microbatches = 0  # this rank's micro-batches with tokens in this window
        self.local_tokens = 0
        self._last_microbatch_s = 0.0
        self._start_window()

    # -- inside a window -------------------------------------------------------------------

    def begin_microbatch(self, n_tokens: int) -> bool:
        """Announce a micro-batch of `n_tokens` tokens on this rank. Returns whether it is this
        rank's last in the window, decided from this rank's own count, tokens or clock.

        A rank with no data for this micro-batch (the end of its shard, an uneven split) sits
        it out with `begin_microbatch(0)` and skips its backward; it still closes the window
        with the others, so the ranks' collectives stay matched."""
        now = self.wall_clock()
        if self._tick_start is not None:
            self._last_microbatch_s = now - self._tick_start
        self._tick_start = now
        self._ticks += 1
        self.local_tokens += n_tokens
        self.local_microbatches += int(n_tokens > 0)
        self._pending_tokens = n_tokens
        last = self._decide(now)
        self._gradients.before_microbatch(n_tokens, last)
        return last

    def _decide(self, now: float) -> bool:
        cfg = self.config
        if self._ticks >= cfg.max_microbatches:
            return True
        if cfg.policy == "microbatches":
            return self._ticks >= cfg.microbatches
        if cfg.policy == "tokens":
            return self.local_tokens >= self._quota
        if cfg.policy == "seconds":
            # Close on the micro-batch expected to reach the window length on this rank.
            return now - self._window_start + self._last_microbatch_s >= cfg.seconds
        return self._ticks >= self.length

    def backward(self, loss_sum: torch.Tensor) -> None:
        """Backpropagate a token-summed loss into the window's accumulated gradient."""
        loss_sum.backward()
        self._loss += loss_sum.detach().to(torch.float64)
        if self._track_noise:
            self._record_increment(self._pending_tokens)

    @torch.no_grad()
    def _record_increment(self, n_tokens: int) -> None:
        c = self._control
        c[_SQ_INCREMENTS] += self._gradients.increment_square()
        c[_MICROBATCH_TOKENS_SQ] += float(n_tokens) ** 2

    # -- closing a window ------------------------------------------------------------------

    @torch.no_grad()
    def close(self, lr: float) -> WindowRecord:
        """All-reduce, divide by the global token count, clip, step at `lr`, zero.

        `lr` is the LR of a param group built at the optimizer's default LR; a group built
        with its own LR keeps its ratio to that default (a group at 0.1x the default steps at
        0.1 * lr), the ratio read from each group's `initial_lr` when the window was built.

        A non-finite loss or gradient on any rank reaches every rank through the all-reduce;
        then no step is taken (`stepped=False` in the record) and the gradient is dropped.
        """
        self._gradients.check()
        # Every rank makes the same collectives in the same order: gradients (the buckets an
        # overlapped backward already started come first; sharded, the reduce-scatter ran in
        # the last backward), then the control vector.
        local = self._local_control()
        self._gradients.sum_over_ranks()
        control = local if self.world_size == 1 else self._all_reduce(local)
        tokens = int(control[_TOKENS])
        scale = 1.0 / max(tokens, 1)
        self._gradients.normalize(scale)
        loss = float(control[_LOSS]) * scale
        grad_norm = self._gradients.norm()
        stepped = tokens > 0 and math.isfinite(grad_norm) and math.isfinite(loss)
        if stepped:
            clip = self.config.clip_norm
            if clip is not None:
                # Same coefficient as torch.nn.utils.clip_grad_norm_.
                coefficient = min(clip / (grad_norm + 1e-6), 1.0)
                if coefficient < 1.0:
                    for grad in self._gradients.tensors():
                        grad.mul_(coefficient)
            groups = self.optimizer.param_groups
            for group, group_lr in zip(groups, group_lrs(self.optimizer, lr), strict=True):
                group["lr"] = group_lr
            self.optimizer.step()
        if self._track_noise:
            self.length = self._next_length(control)
        self._gradients.zero()
        seconds = self.wall_clock() - self._window_start
        record = WindowRecord(
            index=self.windows,
            wall_time=time.time(),
            seconds=seconds,
            microbatches=int(control[_MICROBATCHES]),
            tokens=tokens,
            loss=loss,
            grad_norm=grad_norm,
            lr=lr,
            tokens_per_s=tokens / seconds if seconds > 0 else math.inf,
            stepped=stepped,
        )
        self.tokens_seen += tokens
        self.windows += 1
        self._start_window()
        return record

    def _local_control(self) -> torch.Tensor:
        """This rank's control vector (float64: exact counts and loss), taken before any
        gradient is reduced: the noise statistics need this rank's own sum."""
        c = self._control
        c[_TOKENS] = self.local_tokens
        c[_MICROBATCHES] = self.local_microbatches
        c[_LOSS] = float(self._loss)
        if self._track_noise:
            c[_SQ_SUM] = self._gradients.local_square()
            c[_NOISE_TOKENS] = self.local_tokens
            c[_RANK_TOKENS_SQ] = float(self.local_tokens) ** 2
        return c

    def _all_reduce(self, control: torch.Tensor) -> torch.Tensor:
        agreed = control.to(self._control_device, copy=True)
        dist.all_reduce(agreed, group=self.group)
        return agreed.cpu()

    def _next_length(self, control: torch.Tensor) -> int:
        """The next window's length: SNR grows in proportion to the window's tokens, so scale
        this one's by target / estimate (unchanged while the estimate is undefined)."""
        cfg = self.config
        snr = estimated_snr(control)
        if math.isnan(snr):
            return self.length
        if snr <= 0:  # no signal seen: as long as allowed
            return cfg.max_microbatches
        wanted = cfg.min_microbatches if snr == math.inf else math.ceil(self._ticks * cfg.snr / snr)
        return min(max(wanted, cfg.min_microbatches), cfg.max_microbatches)

    def _start_window(self) -> None:
        self._control = torch.zeros(_CONTROL_SIZE, dtype=torch.float64)
        self._loss = torch.zeros((), dtype=torch.float64, device=self.params[0].device)
        self._ticks = 0
        self.local_tokens = 0
        self.local_microbatches = 0
        self._pending_tokens = 0
        self._window_start = self.wall_clock()
        self._tick_start = None
        self._gradients.start_window()

    # -- checkpoints (always taken at window boundaries) ------------------------------------

    def state_dict(self) -> dict:
        """What every rank shares: the token clock and the `grad_norm` window length."""
        return {"tokens_seen": self.tokens_seen, "windows": self.windows, "length": self.length}

    def load_state_dict(self, state: dict) -> None:
        self.tokens_seen = int(state["tokens_seen"])
        self.windows = int(state["windows"])
        self.length = int(state["length"])

    def rank_state_dict(self) -> dict:
        """What this rank alone holds: its error-feedback residuals, if compressed."""
        return self._gradients.state_dict()

    def load_rank_state_dict(self, state: dict) -> None:
        self._gradients.load_state_dict(state)
