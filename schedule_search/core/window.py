"""Time-windowed gradient accumulation across data-parallel ranks.

A window is the set of micro-batches between two optimizer steps, on all ranks together.

How it stays correct and cheap:
- Each parameter's `.grad` is a view into one flat buffer per dtype, so backward accumulates in
  place and closing a window is one all-reduce per dtype (one in practice), with no gradient
  collective inside the window.
- The loss is summed over tokens; at close the summed gradient is divided by the *global* token
  count, so the result is the big-batch gradient of the mean token loss whatever each rank's
  micro-batch count or size. Clipping comes after that normalization.
- Where the close depends on other ranks (the tokens, seconds and grad_norm policies), ranks
  all-reduce a tiny float64 control vector (tokens, rank 0's clock, gradient-noise
  statistics) before each micro-batch and each computes the same close decision from the same
  numbers. A window of a fixed number of micro-batches closes at the same tick everywhere
  without asking; its control vector (the token count) is reduced once, at close. Either way
  every rank makes the same collectives in the same order, so none can wait on a collective
  another skipped.
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

__all__ = [
    "WindowAccumulator",
    "WindowConfig",
    "WindowRecord",
    "broadcast_parameters",
    "estimated_snr",
]


@dataclass
class WindowConfig:
    """When a window closes, and how its gradient is clipped.

    policy: `microbatches` closes after `microbatches` micro-batches (deterministic);
    `tokens` once the window holds `tokens` tokens over all ranks; `seconds` once rank 0's wall
    clock has spent `seconds` in the window (the seed's 5-minute window); `grad_norm` once the
    accumulated gradient's estimated signal-to-noise ratio reaches `snr` (estimated only once
    `min_microbatches` micro-batches are in: fewer give too noisy an estimate).
    `max_microbatches` caps every policy so a window always ends.
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


# Slots of the control vector (summed over ranks).
_TOKENS, _MICROBATCHES, _ELAPSED, _LAST_DT, _SQ_INCREMENTS, _SQ_SUM, _N_SQ, _n_SQ, _N_PREV = range(
    9
)
_CONTROL_SIZE = 9


@dataclass
class _Bucket:
    """One flat gradient buffer for the parameters of one dtype and device; slot -1 is the loss."""

    flat: torch.Tensor
    params: list[torch.Tensor]
    views: list[torch.Tensor]

    @property
    def grads(self) -> torch.Tensor:
        return self.flat[:-1]


def _make_buckets(params: Sequence[torch.Tensor]) -> list[_Bucket]:
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for p in params:
        groups.setdefault((p.dtype, p.device), []).append(p)
    buckets = []
    for (dtype, device), members in groups.items():
        flat = torch.zeros(sum(p.numel() for p in members) + 1, dtype=dtype, device=device)
        views, offset = [], 0
        for p in members:
            views.append(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        buckets.append(_Bucket(flat, members, views))
    return buckets


def _distributed(group: dist.ProcessGroup | None) -> tuple[int, int]:
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


@torch.no_grad()
def broadcast_parameters(
    params: Sequence[torch.Tensor], group: dist.ProcessGroup | None = None
) -> None:
    """Make every rank start from rank 0's weights (what DDP's constructor does)."""
    _, world = _distributed(group)
    if world > 1:
        src = dist.get_global_rank(group, 0) if group is not None else 0
        for p in params:
            dist.broadcast(p.data, src=src, group=group)


def estimated_snr(control: torch.Tensor) -> float:
    """Signal-to-noise ratio of the window's mean gradient, from micro-batch statistics.

    Model: a micro-batch of n tokens has gradient sum g = n G + noise with E|noise|^2 = n s2.
    With Q1 = sum |g_i|^2 over micro-batches and Q2 = sum over ranks |S_r|^2 (S_r: a rank's
    accumulated sum, N_r its tokens), E[Q2 - Q1] = |G|^2 (sum N_r^2 - sum n_i^2), which gives
    |G|^2 and then s2 from Q1. The SNR of the mean over N tokens is N |G|^2 / s2. Needs two
    micro-batches on some rank; NaN before that.
    """
    q1, q2 = float(control[_SQ_INCREMENTS]), float(control[_SQ_SUM])
    big, small, n = float(control[_N_SQ]), float(control[_n_SQ]), float(control[_N_PREV])
    if big - small <= 0 or n <= 0:
        return math.nan
    signal = max((q2 - q1) / (big - small), 0.0)
    noise = (q1 - signal * small) / n
    if noise <= 0:
        return math.inf
    return n * signal / noise


class WindowAccumulator:
    """Accumulates micro-batches into windows and takes one optimizer step per window.

    The loop, on every rank::

        last = window.begin_microbatch(n_tokens)   # agreed by all ranks before backward
        window.backward(loss_sum)                  # loss summed (not averaged) over tokens
        if last:
            record = window.close(lr)              # all-reduce, normalize, clip, step, zero
    """

    # The window in progress, set by `_start_window` at the start and at every close.
    _control: torch.Tensor
    _agreed: torch.Tensor
    _ticks: int
    _local_tokens: int
    _local_microbatches: int
    _pending_tokens: int
    _window_start: float
    _tick_start: float | None

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        optimizer: torch.optim.Optimizer,
        config: WindowConfig,
        group: dist.ProcessGroup | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.optimizer = optimizer
        self.config = config
        self.group = group
        self.clock = clock
        self.rank, self.world_size = _distributed(group)
        # NCCL reduces only CUDA tensors; gloo (and one process) keeps the control on the CPU.
        nccl = self.world_size > 1 and dist.get_backend(group) == "nccl"
        self._control_device = self.params[0].device if nccl else torch.device("cpu")
        broadcast_parameters(self.params, group)
        self._buckets = _make_buckets(self.params)
        self._bind_grads()
        self._track_noise = config.policy == "grad_norm"
        self._agree_each_microbatch = config.policy != "microbatches"
        self._previous = [b.grads.clone() for b in self._buckets] if self._track_noise else []
        for param_group in optimizer.param_groups:  # torch's LR schedulers use the same key
            param_group.setdefault("initial_lr", param_group["lr"])
        self.tokens_seen = 0
        self.windows = 0
        self._last_microbatch_s = 0.0
        self._start_window()

    # -- inside a window -------------------------------------------------------------------

    def begin_microbatch(self, n_tokens: int) -> bool:
        """Announce a micro-batch of `n_tokens` tokens on this rank. Returns whether it is the
        window's last, the same on every rank.

        A rank with no data for this micro-batch (the end of its shard, an uneven split) sits
        it out with `begin_microbatch(0)` and skips its backward; it still takes part in the
        window's agreement and close, so the ranks' collectives stay matched."""
        now = self.clock()
        if self._tick_start is not None:
            self._last_microbatch_s = now - self._tick_start
        self._tick_start = now
        self._ticks += 1
        self._local_tokens += n_tokens
        self._local_microbatches += int(n_tokens > 0)
        local = self._control
        local[_TOKENS] = self._local_tokens
        local[_MICROBATCHES] = self._local_microbatches
        if self.rank == 0:
            local[_ELAPSED] = now - self._window_start
            local[_LAST_DT] = self._last_microbatch_s
        # A window of a fixed number of micro-batches closes at the same tick on every rank
        # without asking the others; its token count is agreed once, at close.
        agreed = self._reduce(local) if self._agree_each_microbatch else local
        self._agreed = agreed
        self._pending_tokens = n_tokens
        return self._decide(agreed)

    def _reduce(self, control: torch.Tensor) -> torch.Tensor:
        """The control vector summed over ranks."""
        if self.world_size == 1:
            return control
        agreed = control.to(self._control_device, copy=True)
        dist.all_reduce(agreed, group=self.group)
        return agreed.cpu()

    def _decide(self, agreed: torch.Tensor) -> bool:
        cfg = self.config
        if self._ticks >= cfg.max_microbatches:
            return True
        if cfg.policy == "microbatches":
            return self._ticks >= cfg.microbatches
        if cfg.policy == "tokens":
            return float(agreed[_TOKENS]) >= cfg.tokens
        if cfg.policy == "seconds":
            # Close on the micro-batch expected to reach the window length (rank 0's clock).
            return float(agreed[_ELAPSED] + agreed[_LAST_DT]) >= cfg.seconds
        if self._ticks <= cfg.min_microbatches:  # statistics so far cover ticks - 1 batches
            return False
        snr = estimated_snr(agreed)
        return not math.isnan(snr) and snr >= cfg.snr

    def backward(self, loss_sum: torch.Tensor) -> None:
        """Backpropagate a token-summed loss into the window's accumulated gradient."""
        loss_sum.backward()
        loss_bucket = self._buckets[0].flat
        loss_bucket[-1] += loss_sum.detach().to(loss_bucket.dtype)
        if self._track_noise:
            self._record_increment(self._pending_tokens)

    @torch.no_grad()
    def _record_increment(self, n_tokens: int) -> None:
        increment_sq = 0.0
        total_sq = 0.0
        for bucket, previous in zip(self._buckets, self._previous, strict=True):
            increment_sq += float(torch.sum((bucket.grads - previous) ** 2))
            total_sq += float(torch.sum(bucket.grads**2))
            previous.copy_(bucket.grads)
        c = self._control
        c[_SQ_INCREMENTS] += increment_sq
        c[_SQ_SUM] = total_sq
        c[_n_SQ] += float(n_tokens) ** 2
        c[_N_PREV] += n_tokens
        c[_N_SQ] = float(c[_N_PREV]) ** 2

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
        self._check_grads_bound()
        if not self._agree_each_microbatch:
            self._agreed = self._reduce(self._control)
        for bucket in self._buckets:
            if self.world_size > 1:
                dist.all_reduce(bucket.flat, group=self.group)
        tokens = int(self._agreed[_TOKENS])
        microbatches = int(self._agreed[_MICROBATCHES])
        scale = 1.0 / max(tokens, 1)
        for bucket in self._buckets:
            bucket.flat.mul_(scale)
        loss = float(self._buckets[0].flat[-1])
        norms = [torch.linalg.vector_norm(b.grads, dtype=torch.float64) for b in self._buckets]
        grad_norm = float(torch.linalg.vector_norm(torch.stack(norms)))
        stepped = tokens > 0 and math.isfinite(grad_norm) and math.isfinite(loss)
        if stepped:
            clip = self.config.clip_norm
            if clip is not None:
                # Same coefficient as torch.nn.utils.clip_grad_norm_.
                coefficient = min(clip / (grad_norm + 1e-6), 1.0)
                if coefficient < 1.0:
                    for bucket in self._buckets:
                        bucket.grads.mul_(coefficient)
            for param_group in self.optimizer.param_groups:
                param_group["lr"] = lr * self._lr_ratio(param_group)
            self.optimizer.step()
        for bucket in self._buckets:
            bucket.flat.zero_()
        now = self.clock()
        seconds = now - self._window_start
        record = WindowRecord(
            index=self.windows,
            wall_time=time.time(),
            seconds=seconds,
            microbatches=microbatches,
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

    def _lr_ratio(self, group: dict) -> float:
        default = float(self.optimizer.defaults.get("lr", 0.0))
        return float(group["initial_lr"]) / default if default > 0 else 1.0

    def _start_window(self) -> None:
        self._control = torch.zeros(_CONTROL_SIZE, dtype=torch.float64)
        self._agreed = self._control.clone()
        self._ticks = 0
        self._local_tokens = 0
        self._local_microbatches = 0
        self._pending_tokens = 0
        self._window_start = self.clock()
        self._tick_start = None
        for previous in self._previous:
            previous.zero_()

    def _bind_grads(self) -> None:
        for bucket in self._buckets:
            for p, view in zip(bucket.params, bucket.views, strict=True):
                p.grad = view

    def _check_grads_bound(self) -> None:
        for bucket in self._buckets:
            for p, view in zip(bucket.params, bucket.views, strict=True):
                if p.grad is None or p.grad.data_ptr() != view.data_ptr():
                    raise RuntimeError(
                        "a parameter's .grad was replaced inside a window (was "
                        "optimizer.zero_grad() called?); the window owns zeroing gradients"
                    )

    # -- checkpoints (always taken at window boundaries) ------------------------------------

    def state_dict(self) -> dict:
        return {"tokens_seen": self.tokens_seen, "windows": self.windows}

    def load_state_dict(self, state: dict) -> None:
        self.tokens_seen = int(state["tokens_seen"])
        self.windows = int(state["windows"])
