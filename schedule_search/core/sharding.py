"""Sharded windows: a model whose parameters, gradients and optimizer state are sharded across
the data-parallel ranks with FSDP2 (`torch.distributed.fsdp.fully_shard`), under the same
windows as a replicated one.

How a window runs sharded (`ShardedGradients`):
- Gradient sync is off for every micro-batch but each rank's last one of the window, so the
  unsharded gradient sum accumulates locally and the window's one reduce-scatter runs in that
  last backward (FSDP overlaps it with the backward, bucket by module). Summed, not averaged
  (`set_gradient_divide_factor(1)` with sum-only collectives): the close divides by the
  global token count as a replicated close does.
- Where ranks may run different numbers of micro-batches in a window (`tokens`, `seconds`),
  the parameters are gathered once, at the window's first micro-batch, and held until the
  close: no collective inside the window, as replicated. Where every rank runs the same count
  (`microbatches`), FSDP gathers each module for its forward and backward and frees it after
  (FSDP's default, which holds the fewest weights): those all-gathers are inside the window
  but matched one for one. Either way each rank holds the window's unsharded gradient sum.
- The close takes the global norm of the normalized gradient from the shards' squares (one
  float64 all-reduce), then clips and steps AdamW on the local shards.

Checkpoints hold full tensors in the replicated format (`full_state` / `load_full_state`,
torch.distributed.checkpoint's state-dict API, gathered to rank 0's CPU memory): a checkpoint
resumes sharded or replicated, on any world size, and the transfer's continuations and WSD
branches read it unchanged.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeGuard, cast

import torch
import torch.distributed as dist

from schedule_search.core.reduction import broadcast_parameters
from schedule_search.core.window import WindowConfig

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

__all__ = [
    "ShardedGradients",
    "Sharding",
    "check_window",
    "full_ema_state",
    "full_state",
    "full_tensor",
    "is_sharded",
    "load_full_state",
    "local_ema_state",
    "local_tensors",
    "reshard",
    "shard_model",
]

Sharding = Literal["replicated", "fsdp"]


def _loaded(module: str, name: str) -> type | None:
    """Class `name` of `module` if that module was imported, else None.

    FSDP and DTensor (with torch.distributed.checkpoint) cost about 0.6 s to import on 2 cores,
    in every process that imports the trainer: every Ray Train worker, trial and CLI call. A
    replicated run never needs them, and nothing can be an instance of a class whose module
    was never loaded, so the checks below ask without importing; what shards imports."""
    loaded = sys.modules.get(module)
    return getattr(loaded, name, None) if loaded is not None else None


def is_sharded(model: torch.nn.Module) -> bool:
    fsdp_module = _loaded("torch.distributed.fsdp", "FSDPModule")
    return fsdp_module is not None and isinstance(model, fsdp_module)


def _is_dtensor(value: Any) -> TypeGuard[DTensor]:
    dtensor = _loaded("torch.distributed.tensor", "DTensor")
    return dtensor is not None and isinstance(value, dtensor)


def _fsdp_modules(model: torch.nn.Module) -> list[FSDPModule]:
    fsdp_module = _loaded("torch.distributed.fsdp", "FSDPModule")
    if fsdp_module is None:
        return []
    return [cast("FSDPModule", m) for m in model.modules() if isinstance(m, fsdp_module)]


def shard_model(model: torch.nn.Module) -> torch.nn.Module:
    """Shard `model` in place over the default process group, on the device its parameters
    are on: every member of a ModuleList (a transformer's blocks; nested lists innermost
    first) is its own FSDP unit, the root holds the rest (embeddings, a tied head). Every rank
    starts from rank 0's weights, as replicated."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    broadcast_parameters(list(model.parameters()))
    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for child in reversed(list(model.modules())):
        if isinstance(child, torch.nn.ModuleList):
            for block in child:
                fully_shard(block, mesh=mesh)
    sharded = cast(torch.nn.Module, fully_shard(model, mesh=mesh))
    for module in _fsdp_modules(sharded):
        module.set_gradient_divide_factor(1.0)  # sums: the close divides by global tokens
        module.set_force_sum_reduction_for_comms(True)  # SUM only (gloo has no PREMUL_SUM)
    return sharded


def reshard(model: torch.nn.Module) -> None:
    """Free every gathered parameter, so the next forward gathers the local shards afresh
    (after an EMA was swapped into them, or the optimizer stepped them). No-op replicated."""
    for module in _fsdp_modules(model):
        module.reshard()


@torch.no_grad()
def local_tensors(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor's local shard (a view of the storage FSDP gathers from and AdamW steps);
    an unsharded tensor (a buffer) is itself."""
    dtensor = _loaded("torch.distributed.tensor", "DTensor")  # once a call: every window
    if dtensor is None:
        return list(tensors)
    return [cast("DTensor", t).to_local() if isinstance(t, dtensor) else t for t in tensors]


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's full tensor (a collective: every rank gathers it); any other tensor itself."""
    return tensor.full_tensor() if _is_dtensor(tensor) else tensor


def check_window(config: WindowConfig) -> None:
    """Refuse the window settings that do not run sharded (ValueErrors naming the key)."""
    if config.policy == "grad_norm":
        raise ValueError(
            "window.policy: grad_norm does not run sharded (fsdp): its noise statistics "
            "need each rank's unreduced gradient sum; use microbatches, tokens or seconds"
        )
    if config.compression != "none":
        raise ValueError(
            "window.compression: fsdp reduce-scatters in full precision; expected none"
        )


class ShardedGradients:
    """An FSDP model's window gradient (see the module docstring). `hold`: gather the
    parameters once per window and keep them until the close (ranks may differ in micro-batch
    counts); otherwise FSDP gathers and frees each module around its forward and backward.

    A rank may sit out a micro-batch (`begin_microbatch(0)`, no backward) only when holding
    and not on its last: the others would wait for its gathers or its reduce-scatter. It is
    refused with a ValueError on that rank (its peers then wait for the group's timeout)."""

    def __init__(self, model: torch.nn.Module, params: Sequence[torch.Tensor], hold: bool) -> None:
        if not is_sharded(model):
            raise TypeError("ShardedGradients needs a model sharded with fully_shard")
        self.model = model  # an FSDPModule too: `fsdp` is the same object, typed as one
        self.fsdp = cast("FSDPModule", model)
        self.params = list(params)
        self.hold = hold
        self._device = self.params[0].device  # NCCL reduces only device tensors
        if hold:  # FSDP's defaults otherwise (its root keeps its weights from forward to backward)
            self.fsdp.set_reshard_after_forward(False)
            self.fsdp.set_reshard_after_backward(False)
        self.fsdp.set_requires_gradient_sync(False)
        self._gathered = False

    @classmethod
    def for_window(
        cls, model: torch.nn.Module, params: Sequence[torch.Tensor], config: WindowConfig
    ) -> ShardedGradients:
        """Only `microbatches` windows give every rank the same micro-batch count, which
        FSDP's per-module gathers need; every other policy gathers once a window and holds.
        `grad_norm` (its noise statistics need each rank's unreduced sum) and compression
        (FSDP reduce-scatters in full precision) are refused."""
        check_window(config)
        return cls(model, params, hold=config.policy != "microbatches")

    def start_window(self) -> None:
        self._gathered = False

    def before_microbatch(self, n_tokens: int, last: bool) -> None:
        if n_tokens == 0 and (last or not self.hold):
            raise ValueError(
                "a sharded (fsdp) window runs a backward on each rank's last micro-batch (its "
                "reduce-scatter) and, gathering per module (microbatches windows), on every "
                "one; this rank sat one of those out"
            )
        if self.hold and not self._gathered:
            reshard(self.model)  # drop what an evaluation left gathered
            for module in _fsdp_modules(self.model):
                module.unshard()
            self._gathered = True
        self.fsdp.set_requires_gradient_sync(last)

    def check(self) -> None:
        """FSDP owns `.grad`; nothing of ours to check."""

    def increment_square(self) -> float:
        raise NotImplementedError("the grad_norm policy does not run sharded (fsdp)")

    def local_square(self) -> float:
        raise NotImplementedError("the grad_norm policy does not run sharded (fsdp)")

    def sum_over_ranks(self) -> None:
        """The reduce-scatter ran in this rank's last backward; free the held parameters."""
        if self.hold:
            reshard(self.model)
        self.fsdp.set_requires_gradient_sync(False)

    def norm(self) -> float:
        """The normalized gradient's global norm: the shards' squares summed over ranks (one
        float64 all-reduce; taken after normalizing, as a replicated close takes it)."""
        square = torch.zeros(1, dtype=torch.float64, device=self._device)
        for grad in self.tensors():
            square += torch.linalg.vector_norm(grad, dtype=torch.float64) ** 2
        dist.all_reduce(square)
        return math.sqrt(float(square))

    def normalize(self, scale: float) -> None:
        for grad in self.tensors():
            grad.mul_(scale)

    def tensors(self) -> list[torch.Tensor]:
        return local_tensors([p.grad for p in self.params if p.grad is not None])

    def zero(self) -> None:
        for p in self.params:
            p.grad = None  # FSDP adds the next reduce-scatter into a `.grad` left in place

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        del state  # no per-rank state: FSDP's reduce-scatter is exact


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """(model, optimizer) state dicts of full tensors on rank 0's CPU (empty elsewhere), the
    optimizer's exactly as a replicated `Optimizer.state_dict()` (keyed by index, its param
    groups its own). A collective: every rank holds the same state keys in the same order.

    The optimizer state is gathered here rather than by torch's `get_optimizer_state_dict`,
    which takes a step at LR 0 to create the state of an optimizer that has none, and does
    not know schedule-free AdamW's."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(model, options=options)
    local = optimizer.state_dict()
    state = {
        index: {key: _full(value) for key, value in slot.items()}
        for index, slot in local["state"].items()
    }
    if dist.get_rank() != 0:
        return model_state, {}
    return model_state, {"state": state, "param_groups": local["param_groups"]}


def load_full_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    model_state: dict,
    optimizer_state: dict,
) -> None:
    """Load full (replicated-format) state dicts, which every rank holds, into the shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, model_state, options=StateDictOptions(full_state_dict=True))
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {
        index: {key: _shard_like(value, params[int(index)]) for key, value in slot.items()}
        for index, slot in optimizer_state["state"].items()
    }
    optimizer.load_state_dict({**optimizer_state, "state": state})


def _full(value: Any) -> Any:
    """A state value as a full CPU tensor (a DTensor gathered); anything else as it is."""
    if _is_dtensor(value):
        return value.full_tensor().cpu()
    return value.cpu().clone() if isinstance(value, torch.Tensor) else value


def _shard_like(value: Any, param: torch.Tensor) -> Any:
    """A full state tensor of `param`'s shape, cut to `param`'s sharding (scalars, such as
    AdamW's step, stay as they are)."""
    if not (_is_dtensor(param) and isinstance(value, torch.Tensor)):
        return value
    if value.shape != param.shape:
        return value
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(
        value.to(param.device), param.device_mesh, param.placements, src_data_rank=None
    )


def full_ema_state(state: dict, sources: Sequence[torch.Tensor]) -> dict:
    """An `EmaBank.state_dict()` of local shards, with each average gathered to its full
    tensor on rank 0's CPU (`sources`: the tensors the bank averages, DTensors where sharded;
    other ranks keep none). A collective."""
    keep = dist.get_rank() == 0
    averages = {}
    for frac, avg in state["averages"].items():
        gathered = [_gathered(a, source) for a, source in zip(avg, sources, strict=True)]
        averages[frac] = gathered if keep else []
    return {**state, "averages": averages}


def local_ema_state(state: dict, sources: Sequence[torch.Tensor]) -> dict:
    """The inverse of `full_ema_state`: each full average cut to this rank's shard."""
    averages = {
        frac: [_local_shard(a, source) for a, source in zip(avg, sources, strict=True)]
        for frac, avg in state["averages"].items()
    }
    return {**state, "averages": averages}


def _gathered(local: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """A local shard of `source` (an EMA's) as the full CPU tensor."""
    if _is_dtensor(source):
        from torch.distributed.tensor import DTensor

        local = DTensor.from_local(
            local, source.device_mesh, source.placements, shape=source.shape, stride=source.stride()
        )
    return _full(local)


def _local_shard(full: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """A full EMA average cut to this rank's shard of `source`."""
    if not _is_dtensor(source):
        return full
    if full.shape != source.shape:
        raise ValueError(f"an EMA average of shape {tuple(full.shape)} does not fit {source.shape}")
    return _shard_like(full, source).to_local()
