"""One worker's training loop: a budget in tokens, evaluations at Chinchilla multiples,
checkpoints at window boundaries, exact resume.

`train()` is the loop, written out so a reader sees, in order, where a micro-batch is announced,
where the window closes, where the clock advances and sets the LR, where the EMAs update, and
where evaluation and checkpoints happen. Everything outside it (where metrics and checkpoints
go, which rank this is) is a `Session`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from schedule_search.core import checkpoint as ckpt
from schedule_search.core.averaging import EmaBank
from schedule_search.core.clock import TokenClock
from schedule_search.core.sharding import ShardedGradients, shard_model
from schedule_search.core.states import State
from schedule_search.core.window import WindowAccumulator, WindowRecord
from schedule_search.tasks.protocol import Task
from schedule_search.tasks.registry import build_task
from schedule_search.train.config import TrainConfig, check_workers
from schedule_search.train.evaluation import Evaluation, WindowStats, evaluate_losses
from schedule_search.train.session import Session, WindowLog, log_event
from schedule_search.train.state import Progress, Trainee, TrainResult, restore, snapshot

__all__ = ["train"]


def train(config: TrainConfig, session: Session, source: str = "config") -> TrainResult:
    """Train one run to its budget. Every rank of a data-parallel group calls this."""
    run = _Run.build(config, session, source)
    task, model, window, ema = run.task, run.model, run.window, run.ema
    token_clock = run.token_clock
    milestones = config.budget.milestones()
    progress = _start(run, config, session, milestones)
    if progress.status != State.RUNNING:  # a resumed run that had already ended
        session.report(progress.history[-1], None)
        return TrainResult(progress.status, progress.history, progress.reason)
    stats, window_log = WindowStats(), WindowLog(session, window.windows)
    started = time.monotonic() - progress.wall_s
    model.train()
    while progress.milestone < len(milestones):
        # Micro-batch: announce its tokens (every rank learns whether the window closes after
        # it), then the forward and backward pass that add to the window's gradient sum.
        batch = task.microbatch(progress.data_position, session.rank, session.world_size)
        progress.data_position += 1
        last = window.begin_microbatch(batch.tokens)
        with run.autocast:
            loss_sum = task.loss_sum(model, batch)
        window.backward(loss_sum)
        if not last:
            continue

        # Window close: the LR from the token clock at the window's start, one optimizer step
        # on the gradient divided by the window's tokens, then every EMA.
        lr = config.optimizer.lr * run.schedule(token_clock.steps(window.tokens_seen))
        record = window.close(lr)
        ema.update(token_clock.steps(window.tokens_seen))
        stats.records.append(record)
        window_log.write(record)
        progress.wall_s = time.monotonic() - started

        # Milestones: the evaluation points this window's tokens passed.
        reached = progress.milestone
        passed = token_clock.tokens
        while reached < len(milestones) and window.tokens_seen >= passed(milestones[reached]):
            reached += 1
        if record.stepped and reached == progress.milestone:
            if config.checkpoint.every_windows and (
                window.windows % config.checkpoint.every_windows == 0
            ):
                saving = time.monotonic()
                session.save(snapshot(run.trainee, progress, session.rank, session.world_size))
                progress.eval_s += time.monotonic() - saving
            continue

        # Evaluation and report at a milestone. The one way out besides the budget: a window
        # that could not step (non-finite loss or gradient) or a non-finite held-out loss is
        # reported as diverged, with the state it diverged in, and the run ends.
        if record.stepped:
            progress.milestone = reached
        evaluation = _evaluate(run, config, session, progress, record, stats, started)
        progress.status, progress.reason = evaluation.status, evaluation.reason
        progress.history.append(evaluation.to_metrics())
        reporting = time.monotonic()
        state = snapshot(run.trainee, progress, session.rank, session.world_size)
        session.report(progress.history[-1], state)
        progress.eval_s += time.monotonic() - reporting
        if progress.status == State.DIVERGED:
            return TrainResult(State.DIVERGED, progress.history, progress.reason)
    return TrainResult(State.COMPLETED, progress.history)


@dataclass
class _Run:
    """What the loop trains and with what: the task, the trainee (model, optimizer, window,
    EMA bank), the token clock and the schedule, and the precision."""

    task: Task
    trainee: Trainee
    token_clock: TokenClock
    schedule: Callable[[float], float]
    autocast: torch.autocast

    @property
    def model(self) -> torch.nn.Module:
        return self.trainee.model

    @property
    def window(self) -> WindowAccumulator:
        return self.trainee.window

    @property
    def ema(self) -> EmaBank:
        return self.trainee.ema

    @classmethod
    def build(cls, config: TrainConfig, session: Session, source: str) -> _Run:
        torch.set_num_threads(config.threads)
        device = torch.device("cpu") if config.device == "cpu" else session.device()
        bf16 = config.precision == "bf16" or (config.precision == "auto" and device.type == "cuda")
        task = build_task(config.task, config.seed, source)
        model = task.build_model().to(device)
        n_params = task.chinchilla_params(model)
        if config.sharding == "fsdp":
            check_workers(config.sharding, session.world_size, source)
            model = shard_model(model)
        if config.compile:
            model.compile()  # in place: the same parameters and state_dict keys as eager
        params = list(model.parameters())
        token_clock = TokenClock(
            n_params=n_params,
            tokens_per_param=config.budget.tokens_per_param,
            tokens_per_reference_step=config.budget.tokens_per_reference_step
            or task.tokens_per_microbatch,
        )
        optimizer = config.optimizer.build(params)
        gradients = None
        if config.sharding == "fsdp":
            trained = [p for p in params if p.requires_grad]
            gradients = ShardedGradients.for_window(model, trained, config.window)
        trainee = Trainee(
            model=model,
            optimizer=optimizer,
            window=WindowAccumulator(params, optimizer, config.window, gradients=gradients),
            ema=EmaBank.of(model, config.ema.fractions),
        )
        return cls(
            task=task,
            trainee=trainee,
            token_clock=token_clock,
            schedule=config.schedule.build(token_clock.steps_per_chinchilla),
            autocast=torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16),
        )


def _start(run: _Run, config: TrainConfig, session: Session, milestones: list[float]) -> Progress:
    """Fresh, resumed from the session's newest checkpoint, or branched off another run's
    checkpoint (its state, under this run's schedule and milestones)."""
    state = session.latest_state()
    if state is not None:
        progress = restore(state, run.trainee, session.rank, session.world_size)
        log_event(
            session, {"event": "resumed", "tokens": run.window.tokens_seen, "time": time.time()}
        )
        return progress
    if config.branch_from is None:
        return Progress()
    trunk = ckpt.load_state(Path(config.branch_from))
    progress = restore(trunk, run.trainee, session.rank, session.world_size)
    passed = sum(1 for m in milestones if run.token_clock.tokens(m) <= run.window.tokens_seen)
    log_event(
        session,
        {"event": "branched", "from": config.branch_from, "tokens": run.window.tokens_seen},
    )
    return Progress(data_position=progress.data_position, milestone=passed)


def _evaluate(
    run: _Run,
    config: TrainConfig,
    session: Session,
    progress: Progress,
    record: WindowRecord,
    stats: WindowStats,
    started: float,
) -> Evaluation:
    """The record of the milestone just passed (or of the window that diverged): held-out
    losses of the raw weights and every EMA, the windows since the last one, timings."""
    milestones = config.budget.milestones()
    point = Evaluation(
        tokens=run.window.tokens_seen,
        chinchilla=milestones[max(progress.milestone - 1, 0)],
        milestone=progress.milestone,
        windows=run.window.windows,
        val_loss=math.inf,
        status=State.DIVERGED,
        lr=record.lr,
        n_params=run.token_clock.n_params,
        tokens_per_reference_step=run.token_clock.tokens_per_reference_step,
        wall_s=progress.wall_s,
        eval_s=progress.eval_s,
        train_s=progress.wall_s - progress.eval_s,
    )
    stats.summarize_into(point)
    if not record.stepped:
        point.reason = (
            f"non-finite loss or gradient at {point.tokens} tokens "
            f"(loss {record.loss}, grad norm {record.grad_norm})"
        )
        return point
    paused = time.monotonic()
    point.losses, point.ema_fraction, point.val_loss = evaluate_losses(
        run.task,
        run.model,
        run.trainee.optimizer,
        run.ema,
        config.ema,
        session.rank,
        session.world_size,
        run.autocast,
    )
    progress.wall_s = time.monotonic() - started
    progress.eval_s += time.monotonic() - paused
    point.wall_s, point.eval_s = progress.wall_s, progress.eval_s
    point.train_s = progress.wall_s - progress.eval_s
    if not math.isfinite(point.val_loss):
        point.reason = f"non-finite validation loss at {point.tokens} tokens"
    elif progress.milestone < len(milestones):
        point.status = State.RUNNING
    else:
        point.status = State.COMPLETED
    return point
