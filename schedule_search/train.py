"""One worker's training loop: a budget in tokens, evaluations at Chinchilla multiples,
checkpoints at window boundaries, exact resume.

The loop is written out in `train()` so a reader sees, in order, where a micro-batch is
announced, where the window closes, where the clock advances and sets the LR, where the EMAs
update, and where evaluation and checkpoints happen. Everything outside the loop (where
metrics and checkpoints go, which rank this is) is a `Session`: `LocalSession` for a plain or
torch.distributed run; the Ray Train session lives with the search code.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import torch
import torch.distributed as dist
from pydantic import Field

from schedule_search import checkpoint as ckpt
from schedule_search.averaging import EmaBank, EmaConfig, loss_key
from schedule_search.clock import Horizon
from schedule_search.config import STRICT, load_yaml, parse
from schedule_search.schedules import ScheduleConfig
from schedule_search.tasks import Task, build_task
from schedule_search.window import WindowAccumulator, WindowConfig, WindowRecord

Positive = Annotated[float, Field(gt=0)]
CHECKPOINT_FORMAT = 1


@dataclass
class OptimizerConfig:
    """AdamW (weight decay 0 by default, as in the paper), SGD, or schedule-free AdamW
    (Defazio et al. 2024, the `schedulefree` package), at peak LR `lr`.

    Schedule-free AdamW keeps its averaged weights inside the optimizer and is evaluated with
    them (`evaluation_weights`); run it with a constant schedule (warmup included: the LR the
    loop sets is the one it steps with). Its average weighs every optimizer step alike, so
    with windows of variable length a step of few tokens counts as much as a long one."""

    __pydantic_config__ = STRICT

    name: Literal["adamw", "sgd", "schedulefree_adamw"] = "adamw"
    lr: Positive = 3e-3
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (
        0.9,
        0.95,
    )
    eps: Positive = 1e-8
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    momentum: Annotated[float, Field(ge=0, lt=1)] = 0.0

    def build(self, params: Sequence[torch.Tensor]) -> torch.optim.Optimizer:
        if self.name == "sgd":
            return torch.optim.SGD(
                params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay
            )
        if self.name == "schedulefree_adamw":
            from schedulefree import AdamWScheduleFree

            optimizer = AdamWScheduleFree(
                params, lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay
            )
            optimizer.train()
            return optimizer
        return torch.optim.AdamW(
            params, lr=self.lr, betas=self.betas, eps=self.eps, weight_decay=self.weight_decay
        )


@contextlib.contextmanager
def evaluation_weights(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """The model holds the weights it is evaluated with inside this block: for schedule-free
    AdamW its averaged weights x (its `eval()` switch); after it, the training point y comes
    back bit for bit (copied back, not recomputed by `train()`'s interpolation, so a rank that
    evaluated stays identical to one that did not). Other optimizers leave the weights alone."""
    switch = getattr(optimizer, "eval", None)
    if switch is None:
        yield
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    training_point = [p.detach().clone() for p in params]
    switch()
    try:
        yield
    finally:
        optimizer.train()  # type: ignore[attr-defined]
        with torch.no_grad():
            torch._foreach_copy_([p.detach() for p in params], training_point)


@dataclass
class BudgetConfig:
    """How long to train and where to evaluate, in Chinchilla multiples (1x = tokens_per_param
    x the task's Chinchilla parameter count). `tokens_per_reference_step` is the clock's unit
    (default: one micro-batch of one rank); schedules are in the same unit, so it only changes
    how t reads, never the LR a token sees."""

    __pydantic_config__ = STRICT

    horizon: Positive = 4.0
    eval_at: list[Positive] = field(default_factory=lambda: [0.25, 0.5, 1.0, 2.0, 4.0])
    tokens_per_param: Positive = 20.0
    tokens_per_reference_step: Annotated[int, Field(gt=0)] | None = None

    def milestones(self) -> list[float]:
        """Evaluation points up to the horizon, which is always one of them."""
        return sorted({m for m in self.eval_at if m < self.horizon} | {self.horizon})


@dataclass
class CheckpointConfig:
    """Checkpoints are taken at every evaluation point, and every `every_windows` windows
    when that is > 0; only the newest `keep` are kept."""

    __pydantic_config__ = STRICT

    every_windows: Annotated[int, Field(ge=0)] = 0
    keep: Annotated[int, Field(ge=1)] = 2


@dataclass
class TrainConfig:
    __pydantic_config__ = STRICT

    task: dict[str, Any] = field(default_factory=lambda: {"name": "tinylm"})
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    ema: EmaConfig = field(default_factory=EmaConfig)
    window: WindowConfig = field(default_factory=WindowConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    seed: Annotated[int, Field(ge=0)] = 0
    threads: Annotated[int, Field(ge=1)] = 1
    #: `auto`: the session's accelerator if it has one (Ray Train's GPU, or LOCAL_RANK's GPU
    #: under torchrun), else the CPU.
    device: Literal["auto", "cpu"] = "auto"
    #: `auto`: bf16 autocast on a GPU (bf16 over fp16: no loss scaling), fp32 on the CPU.
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    #: A checkpoint folder of another run to start from: its weights, optimizer, EMAs, clock
    #: and data position, under this run's own schedule and milestones (a WSD branch).
    branch_from: str | None = None

    def __post_init__(self) -> None:
        if "name" not in self.task:
            raise ValueError("task.name: required key is missing")


def load_train_config(path: str | Path) -> TrainConfig:
    return parse(TrainConfig, load_yaml(path), str(path))


class Session(Protocol):
    """Where a run's results go. `report` is called on every rank at every evaluation point
    (a barrier under Ray Train); only rank 0's `state` is stored."""

    rank: int
    world_size: int
    log_dir: Path

    def device(self) -> torch.device: ...

    def latest_state(self) -> dict[str, Any] | None: ...

    def report(self, metrics: dict[str, Any], state: dict[str, Any] | None) -> None: ...

    def save(self, state: dict[str, Any]) -> None: ...


@dataclass
class Progress:
    """Where the run stands; saved in every checkpoint."""

    microbatches: int = 0  # data position: micro-batches drawn per rank so far
    milestone: int = 0  # index of the next evaluation point
    wall_s: float = 0.0  # wall-clock seconds spent, summed over resumed runs
    eval_s: float = 0.0  # of which in evaluation, checkpoints and reports
    history: list[dict[str, Any]] = field(default_factory=list)
    status: str = "running"
    reason: str = ""


@dataclass
class TrainResult:
    status: Literal["completed", "diverged"]
    history: list[dict[str, Any]]
    reason: str = ""

    @property
    def final(self) -> dict[str, Any]:
        return self.history[-1] if self.history else {}


class _WindowStats:
    """Aggregates window records between two reports."""

    def __init__(self) -> None:
        self.records: list[WindowRecord] = []

    def summary(self) -> dict[str, float]:
        records, self.records = self.records, []
        if not records:
            return {}
        seconds = sum(r.seconds for r in records)
        tokens = sum(r.tokens for r in records)
        return {
            "grad_norm": records[-1].grad_norm,
            "tokens_per_s": tokens / seconds if seconds > 0 else math.inf,
            "window_s": seconds / len(records),
            "microbatches": sum(r.microbatches for r in records) / len(records),
            "window_tokens": tokens / len(records),
        }


def train(config: TrainConfig, session: Session, source: str = "config") -> TrainResult:
    """Train one run to its budget. Every rank of a data-parallel group calls this."""
    torch.set_num_threads(config.threads)
    device = torch.device("cpu") if config.device == "cpu" else session.device()
    bf16 = config.precision == "bf16" or (config.precision == "auto" and device.type == "cuda")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)
    task: Task = build_task(config.task, config.seed, source)
    model = task.build_model().to(device)
    params = list(model.parameters())
    horizon = Horizon(
        n_params=task.chinchilla_params(model),
        tokens_per_param=config.budget.tokens_per_param,
        tokens_per_reference_step=config.budget.tokens_per_reference_step
        or task.tokens_per_microbatch,
    )
    schedule = config.schedule.build(horizon.steps_per_chinchilla)
    optimizer = config.optimizer.build(params)
    window = WindowAccumulator(params, optimizer, config.window)
    ema = EmaBank.of(model, config.ema.fractions)
    milestones = config.budget.milestones()
    progress = Progress()

    state = session.latest_state()
    if state is not None:
        progress = _restore(state, model, optimizer, window, ema, session)
        _log_event(session, {"event": "resumed", "tokens": window.tokens_seen, "time": time.time()})
    elif config.branch_from is not None:
        trunk = _restore(
            ckpt.load_state(Path(config.branch_from)), model, optimizer, window, ema, session
        )
        passed = sum(1 for m in milestones if horizon.tokens(m) <= window.tokens_seen)
        progress = Progress(microbatches=trunk.microbatches, milestone=passed)
        _log_event(
            session, {"event": "branched", "from": config.branch_from, "tokens": window.tokens_seen}
        )
    if progress.status != "running":  # a resumed run that had already ended
        session.report(progress.history[-1], None)
        return TrainResult(progress.status, progress.history, progress.reason)  # type: ignore[arg-type]

    stats = _WindowStats()
    window_log = _WindowLog(session, window.windows)
    started = time.monotonic() - progress.wall_s
    model.train()
    while progress.milestone < len(milestones):
        batch = task.microbatch(progress.microbatches, session.rank, session.world_size)
        progress.microbatches += 1
        last = window.begin_microbatch(batch.tokens)  # agreed by all ranks before backward
        with autocast:
            loss_sum = task.loss_sum(model, batch)
        window.backward(loss_sum)
        if not last:
            continue

        # The window closes: LR from the token clock at the window's start, one step, EMAs.
        lr = config.optimizer.lr * schedule(horizon.steps(window.tokens_seen))
        record = window.close(lr)
        ema.update(horizon.steps(window.tokens_seen))
        stats.records.append(record)
        window_log.write(record)
        progress.wall_s = time.monotonic() - started

        if not record.stepped:
            progress.status, progress.reason = (
                "diverged",
                (
                    f"non-finite loss or gradient at {window.tokens_seen} tokens "
                    f"(loss {record.loss}, grad norm {record.grad_norm})"
                ),
            )
            metrics = _diverged_metrics(progress, window, horizon, config)
            progress.history.append(metrics)
            session.report(
                metrics, _state(model, optimizer, window, ema, progress, config, session)
            )
            return TrainResult("diverged", progress.history, progress.reason)

        reached = progress.milestone
        while reached < len(milestones) and window.tokens_seen >= horizon.tokens(
            milestones[reached]
        ):
            reached += 1
        if reached > progress.milestone:
            progress.milestone = reached
            paused = time.monotonic()
            metrics = {
                "tokens": window.tokens_seen,
                "chinchilla": milestones[reached - 1],
                "milestone": reached,
                "windows": window.windows,
                "lr": lr,
                "n_params": horizon.n_params,
                "tokens_per_reference_step": horizon.tokens_per_reference_step,
                **stats.summary(),
                **_evaluate(task, model, optimizer, ema, config.ema, session, autocast),
            }
            progress.wall_s = time.monotonic() - started
            progress.eval_s += time.monotonic() - paused
            metrics.update(
                wall_s=progress.wall_s,
                eval_s=progress.eval_s,
                train_s=progress.wall_s - progress.eval_s,
            )
            if not math.isfinite(metrics["val_loss"]):
                progress.status = "diverged"
                progress.reason = f"non-finite validation loss at {window.tokens_seen} tokens"
                metrics.update(status="diverged", reason=progress.reason)
            elif progress.milestone == len(milestones):
                progress.status = "completed"
            metrics["status"] = progress.status
            progress.history.append(metrics)
            report_started = time.monotonic()
            session.report(
                metrics, _state(model, optimizer, window, ema, progress, config, session)
            )
            progress.eval_s += time.monotonic() - report_started
            if progress.status == "diverged":
                return TrainResult("diverged", progress.history, progress.reason)
        elif (
            config.checkpoint.every_windows
            and window.windows % config.checkpoint.every_windows == 0
        ):
            saving = time.monotonic()
            session.save(_state(model, optimizer, window, ema, progress, config, session))
            progress.eval_s += time.monotonic() - saving
    return TrainResult("completed", progress.history)


def _evaluate(
    task: Task,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    ema: EmaBank,
    config: EmaConfig,
    session: Session,
    autocast: torch.autocast,
) -> dict[str, float]:
    """Held-out loss of the raw weights and every EMA; the objective `val_loss` and the
    `ema_fraction` it came from. Rank 0 evaluates and broadcasts, so every rank reports, and
    decides on divergence from, the same numbers."""
    metrics: dict[str, float] = {}
    if session.rank == 0:
        losses = {}
        with evaluation_weights(optimizer):
            for frac in config.fractions:
                with ema.swapped_in(frac), autocast:
                    losses[frac] = task.evaluate(model)
                metrics[loss_key(frac)] = losses[frac]
        metrics["ema_fraction"], metrics["val_loss"] = config.pick(losses)
    if session.world_size > 1:
        shared = [metrics]
        dist.broadcast_object_list(shared, src=0)
        metrics = shared[0]
    return metrics


def _diverged_metrics(
    progress: Progress, window: WindowAccumulator, horizon: Horizon, config: TrainConfig
) -> dict[str, Any]:
    milestones = config.budget.milestones()
    return {
        "tokens": window.tokens_seen,
        "chinchilla": milestones[max(progress.milestone - 1, 0)],
        "milestone": progress.milestone,
        "windows": window.windows,
        "val_loss": math.inf,
        "wall_s": progress.wall_s,
        "status": "diverged",
        "reason": progress.reason,
    }


def _state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    window: WindowAccumulator,
    ema: EmaBank,
    progress: Progress,
    config: TrainConfig,
    session: Session,
) -> dict[str, Any]:
    """Everything a resumed run needs, taken at a window boundary. RNG states of all ranks."""
    rng: list[Any] = [torch.get_rng_state()]
    if session.world_size > 1:
        rng = [None] * session.world_size
        dist.all_gather_object(rng, torch.get_rng_state())
    return {
        "format": CHECKPOINT_FORMAT,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "ema": ema.state_dict(),
        "window": window.state_dict(),
        "progress": asdict(progress),
        "rng": rng,
        "world_size": session.world_size,
    }


def _restore(
    state: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    window: WindowAccumulator,
    ema: EmaBank,
    session: Session,
) -> Progress:
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint format {state.get('format')} is not {CHECKPOINT_FORMAT}")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    ema.load_state_dict(state["ema"])
    window.load_state_dict(state["window"])
    if state["world_size"] == session.world_size:
        torch.set_rng_state(state["rng"][session.rank])
    return Progress(**state["progress"])


def _log_event(session: Session, event: dict[str, Any]) -> None:
    """Rank 0 appends run events (resumes) to `events.jsonl`: an audit trail of restarts."""
    if session.rank == 0:
        session.log_dir.mkdir(parents=True, exist_ok=True)
        with open(session.log_dir / "events.jsonl", "a") as handle:
            handle.write(json.dumps(event) + "\n")


class _WindowLog:
    """Rank 0 appends one JSON line per window to `windows.jsonl`; on resume, records past the
    checkpoint (which the resumed run will redo) are dropped first."""

    def __init__(self, session: Session, resumed_windows: int) -> None:
        self.path = session.log_dir / "windows.jsonl" if session.rank == 0 else None
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            kept = [
                line
                for line in self.path.read_text().splitlines()
                if _is_record_before(line, resumed_windows)
            ]
            ckpt.atomic_write_text(self.path, "".join(f"{line}\n" for line in kept))

    def write(self, record: WindowRecord) -> None:
        if self.path is not None:
            with open(self.path, "a") as handle:
                handle.write(json.dumps(record.to_dict()) + "\n")


def _is_record_before(line: str, windows: int) -> bool:
    try:
        return int(json.loads(line)["index"]) < windows
    except (ValueError, KeyError, TypeError):
        return False  # a line cut short by a kill


class LocalSession:
    """A run outside Ray: metrics and checkpoints under `run_dir`, rank from torch.distributed."""

    def __init__(self, run_dir: str | Path, keep: int = 2) -> None:
        self.log_dir = Path(run_dir).resolve()
        self.checkpoints = self.log_dir / "checkpoints"
        self.keep = keep
        initialized = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if initialized else 0
        self.world_size = dist.get_world_size() if initialized else 1

    def device(self) -> torch.device:
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", self.rank)))
        return torch.device("cpu")

    def latest_state(self) -> dict[str, Any] | None:
        found = ckpt.load_latest(self.checkpoints)
        return None if found is None else found[1]

    def report(self, metrics: dict[str, Any], state: dict[str, Any] | None) -> None:
        if state is not None:
            self.save(state)
        if self.rank == 0:
            history = state["progress"]["history"] if state is not None else [metrics]
            ckpt.atomic_write_text(self.log_dir / "metrics.json", json.dumps(history, indent=1))

    def save(self, state: dict[str, Any]) -> None:
        if self.rank == 0:
            ckpt.save_state(
                self.checkpoints / ckpt.folder_name(state["window"]["tokens_seen"]), state
            )
            ckpt.prune(self.checkpoints, self.keep)
        if self.world_size > 1:
            dist.barrier()
