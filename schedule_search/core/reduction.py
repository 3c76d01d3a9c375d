"""How a window's summed gradient travels between ranks at its close.

Each parameter's `.grad` is a view into a flat bucket, so backward accumulates in place and a
close reduces whole buckets. Three ways to reduce them:

- plain: every bucket all-reduced at the close (fp32 stays fp32);
- overlapped (`Overlap`): during the window's last backward, each bucket's all-reduce starts
  as soon as autograd has accumulated every gradient in it, as DDP does, and the close waits
  only for what is still in flight. Buckets are launched in one fixed order on every rank (a
  bucket waits for the ones before it), so the ranks' collectives always match, even when a
  rank sits the last micro-batch out or a parameter gets no gradient. Summing two ranks'
  values is order-free, so at two ranks the result is bit for bit the plain close's; at more,
  gloo's ring may add in another order (last-bit differences);
- compressed (`ErrorFeedback`): bf16, or int8 with one scale per bucket shared by all ranks,
  gathered and summed in fp32 in rank order (identical on every rank); what rounding dropped
  is added to the next window's gradient (error feedback), so nothing is lost for good.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
import torch.distributed as dist

__all__ = [
    "Bucket",
    "Compression",
    "ErrorFeedback",
    "Gradients",
    "Overlap",
    "ReplicatedGradients",
    "broadcast_parameters",
    "distributed",
    "make_buckets",
]

Compression = Literal["none", "bf16", "int8"]


def distributed(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """(rank, world size) in `group`; (0, 1) without torch.distributed."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


@torch.no_grad()
def broadcast_parameters(
    params: Sequence[torch.Tensor], group: dist.ProcessGroup | None = None
) -> None:
    """Make every rank start from rank 0's weights (what DDP's constructor does)."""
    _, world = distributed(group)
    if world > 1:
        src = dist.get_global_rank(group, 0) if group is not None else 0
        for p in params:
            dist.broadcast(p.data, src=src, group=group)


@dataclass
class Bucket:
    """One flat gradient buffer for parameters of one dtype and device."""

    flat: torch.Tensor
    params: list[torch.Tensor]
    views: list[torch.Tensor]

    @classmethod
    def of(cls, params: list[torch.Tensor]) -> Bucket:
        flat = torch.zeros(
            sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device
        )
        views, offset = [], 0
        for p in params:
            views.append(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        return cls(flat, params, views)

    def bind(self) -> None:
        for p, view in zip(self.params, self.views, strict=True):
            p.grad = view

    def is_bound(self) -> bool:
        return all(
            p.grad is not None and p.grad.data_ptr() == view.data_ptr()
            for p, view in zip(self.params, self.views, strict=True)
        )


def make_buckets(params: Sequence[torch.Tensor], cap_bytes: int) -> list[Bucket]:
    """Buckets of at most `cap_bytes` (a larger parameter gets one of its own), one dtype and
    device each, in reverse parameter order: backward produces the last layers' gradients
    first, so the first buckets fill first."""
    chunks: dict[tuple[torch.dtype, torch.device], list[list[torch.Tensor]]] = {}
    for p in reversed(params):
        groups = chunks.setdefault((p.dtype, p.device), [[]])
        size = sum(q.numel() * q.element_size() for q in groups[-1])
        if groups[-1] and size + p.numel() * p.element_size() > cap_bytes:
            groups.append([])
        groups[-1].append(p)
    return [Bucket.of(members) for groups in chunks.values() for members in groups]


class Overlap:
    """All-reduces buckets while the window's last backward is still running.

    `arm()` before the last micro-batch's backward; `finish()` at the close launches the
    buckets no gradient reached and waits for all of them. A parameter no loss reaches holds
    back the buckets after its own until the close (correct, not overlapped).
    """

    def __init__(self, buckets: list[Bucket], group: dist.ProcessGroup | None) -> None:
        self.buckets = buckets
        self.group = group
        self._armed = False
        self._remaining = [0] * len(buckets)
        self._launched = 0
        self._works: list[dist.Work] = []
        self.started_in_backward = 0  # buckets whose all-reduce overlapped a backward, so far
        for index, bucket in enumerate(buckets):
            for p in bucket.params:
                p.register_post_accumulate_grad_hook(functools.partial(self._ready, index))

    def arm(self) -> None:
        self._armed = True
        self._remaining = [len(b.params) for b in self.buckets]

    def _ready(self, index: int, _param: torch.Tensor) -> None:
        if not self._armed:
            return
        self._remaining[index] -= 1
        while self._launched < len(self.buckets) and self._remaining[self._launched] == 0:
            self._launch()
            self.started_in_backward += 1

    def _launch(self) -> None:
        bucket = self.buckets[self._launched]
        work = dist.all_reduce(bucket.flat, group=self.group, async_op=True)
        assert work is not None  # async_op=True always returns one
        self._works.append(work)
        self._launched += 1

    def finish(self) -> None:
        while self._launched < len(self.buckets):
            self._launch()
        for work in self._works:
            work.wait()
        self._works.clear()
        self._launched = 0
        self._armed = False


class ErrorFeedback:
    """Compressed all-reduce of normalized gradients, with the rounding residual of each
    rank's contribution carried into its next window (each rank keeps its own)."""

    def __init__(self, kind: Compression, buckets: list[Bucket]) -> None:
        if kind == "none":
            raise ValueError("ErrorFeedback needs a compression (bf16 or int8)")
        self.kind = kind
        self.residuals = [torch.zeros_like(b.flat, dtype=torch.float32) for b in buckets]

    def all_reduce(self, index: int, grads: torch.Tensor, group: dist.ProcessGroup | None) -> None:
        """Replace `grads` (bucket `index`) by its compressed sum over ranks. A rank sends 2
        bytes a value (bf16) or 1 and a scale (int8) where a plain all-reduce sends 4."""
        world = dist.get_world_size(group)
        wanted = grads.float() + self.residuals[index]
        if self.kind == "bf16":
            packed = wanted.to(torch.bfloat16)
            sent = packed.float()
            scale = None
        else:
            # A non-finite value anywhere makes the shared scale infinite on every rank (MAX
            # may drop a NaN), so every rank's sum is non-finite and no rank steps.
            finite = bool(torch.isfinite(wanted).all())
            peak = wanted.abs().max().reshape(1) if finite else torch.full((1,), math.inf)
            dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
            scale = float(peak) / 127.0 if float(peak) > 0 else 1.0
            packed = torch.round(wanted / scale).clamp_(-127, 127).to(torch.int8)
            sent = packed.float() * scale
        self.residuals[index] = wanted - sent
        parts = [torch.empty_like(packed) for _ in range(world)]
        dist.all_gather(parts, packed, group=group)
        if scale is None:
            total = functools.reduce(torch.add, (p.float() for p in parts))
        else:  # integers add exactly; one multiply by the shared scale
            total = functools.reduce(torch.add, (p.to(torch.int32) for p in parts)) * scale
        grads.copy_(total)

    def state_dict(self) -> dict:
        return {"kind": self.kind, "residuals": [r.cpu().clone() for r in self.residuals]}

    def load_state_dict(self, state: dict) -> None:
        if state["kind"] != self.kind or len(state["residuals"]) != len(self.residuals):
            raise ValueError(
                f"error-feedback state for {state['kind']} over {len(state['residuals'])} "
                f"buckets does not fit {self.kind} over {len(self.residuals)}"
            )
        for mine, saved in zip(self.residuals, state["residuals"], strict=True):
            mine.copy_(saved)


class Gradients(Protocol):
    """Where a window's gradient sum lives and how it becomes the sum over ranks:
    `reduction.ReplicatedGradients` (flat buckets, all-reduced) or
    `sharding.ShardedGradients` (FSDP2 shards, reduce-scattered)."""

    def start_window(self) -> None: ...

    def before_microbatch(self, n_tokens: int, last: bool) -> None: ...

    def check(self) -> None: ...

    def increment_square(self) -> float: ...

    def local_square(self) -> float: ...

    def sum_over_ranks(self) -> None: ...

    def norm(self) -> float: ...

    def normalize(self, scale: float) -> None: ...

    def tensors(self) -> list[torch.Tensor]: ...

    def zero(self) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class ReplicatedGradients:
    """A replicated model's window gradient: flat buckets bound as `.grad`, summed over ranks
    at the close by a plain, overlapped or compressed all-reduce (the module docstring).
    Building one communicates nothing; `synchronized` first makes every rank's parameters
    rank 0's."""

    @classmethod
    def synchronized(
        cls,
        params: Sequence[torch.Tensor],
        group: dist.ProcessGroup | None,
        bucket_mb: float,
        overlap: bool,
        compression: Compression,
        track_noise: bool,
    ) -> ReplicatedGradients:
        """Broadcast rank 0's parameters to every rank (a collective all of them must reach),
        then build the gradients: replicas that start equal stay equal."""
        broadcast_parameters(params, group)
        return cls(params, group, bucket_mb, overlap, compression, track_noise)

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        group: dist.ProcessGroup | None,
        bucket_mb: float,
        overlap: bool,
        compression: Compression,
        track_noise: bool,
    ) -> None:
        self.group = group
        _, world = distributed(group)
        self.buckets = make_buckets(params, int(bucket_mb * 2**20))
        for bucket in self.buckets:
            bucket.bind()
        compressed = world > 1 and compression != "none"
        self._world = world
        self._feedback = ErrorFeedback(compression, self.buckets) if compressed else None
        overlapped = world > 1 and overlap and not (compressed or track_noise)
        self._overlap = Overlap(self.buckets, group) if overlapped else None
        # The previous micro-batch's sums, for the `grad_norm` policy's increment statistics.
        self._previous = [b.flat.clone() for b in self.buckets] if track_noise else []

    def start_window(self) -> None:
        for previous in self._previous:
            previous.zero_()

    def before_microbatch(self, n_tokens: int, last: bool) -> None:
        del n_tokens  # a rank may sit any micro-batch out
        if last and self._overlap is not None:
            self._overlap.arm()  # the coming backward starts the buckets' all-reduces

    def check(self) -> None:
        if not all(b.is_bound() for b in self.buckets):
            raise RuntimeError(
                "a parameter's .grad was replaced inside a window (was optimizer.zero_grad() "
                "called?); the window owns zeroing gradients"
            )

    def increment_square(self) -> float:
        """|this micro-batch's gradient sum|^2 (the sums' change since the last call)."""
        total = 0.0
        for bucket, previous in zip(self.buckets, self._previous, strict=True):
            total += float(torch.sum((bucket.flat - previous) ** 2))
            previous.copy_(bucket.flat)
        return total

    def local_square(self) -> float:
        """|this rank's gradient sum|^2, before any reduction."""
        return sum(float(torch.sum(b.flat.double() ** 2)) for b in self.buckets)

    def sum_over_ranks(self) -> None:
        """Plain or overlapped: every bucket becomes the gradient sum over ranks. Compressed:
        nothing yet; `normalize` exchanges the mean (`_exchange_compressed_mean`), because the
        error feedback's residual is kept in the units of a mean gradient."""
        if self._feedback is not None:
            return
        if self._overlap is not None:
            self._overlap.finish()
        elif self._world > 1:
            for bucket in self.buckets:
                dist.all_reduce(bucket.flat, group=self.group)

    def norm(self) -> float:
        """The normalized gradient's global norm (every rank holds all of it)."""
        norms = [torch.linalg.vector_norm(b.flat, dtype=torch.float64) for b in self.buckets]
        return float(torch.linalg.vector_norm(torch.stack(norms)))

    def normalize(self, scale: float) -> None:
        """Multiply by `scale` (1 / global tokens); compressed, this rank's share of the mean
        is then exchanged with the other ranks'."""
        for bucket in self.buckets:
            bucket.flat.mul_(scale)
        if self._feedback is not None:
            self._exchange_compressed_mean(self._feedback)

    def _exchange_compressed_mean(self, feedback: ErrorFeedback) -> None:
        """Each bucket, already divided by the global token count, becomes the sum over ranks
        of the compressed shares (what rounding dropped stays in `feedback`'s residuals)."""
        for index, bucket in enumerate(self.buckets):
            feedback.all_reduce(index, bucket.flat, self.group)

    def tensors(self) -> list[torch.Tensor]:
        return [b.flat for b in self.buckets]

    def zero(self) -> None:
        for bucket in self.buckets:
            bucket.flat.zero_()

    def state_dict(self) -> dict:
        return {} if self._feedback is None else {"feedback": self._feedback.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if self._feedback is not None and "feedback" in state:
            self._feedback.load_state_dict(state["feedback"])
