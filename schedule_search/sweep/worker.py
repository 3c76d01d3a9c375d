"""The trainer's edge to Ray: rank, reports and checkpoints inside a TorchTrainer worker
(`RaySession`), or inside the Tune trial's own process for a one-worker CPU trial
(`TrialSession`, see `SweepSettings.in_process`).

`ray.train.report` is a barrier: every rank calls it at every evaluation point; only rank 0
passes a checkpoint. Rank 0 also mirrors the evaluation history into the trial's folder, so
`status` can read it without Ray. Either way a run's checkpoints lie in its run folder
(`train/<run>/checkpoint_<tokens>`), where a resumed trial and the transfer find them.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import ray
import ray.train
import ray.train.torch
import ray.util
import torch
from ray import tune

from schedule_search.core import checkpoint as ckpt
from schedule_search.core.config import parse
from schedule_search.core.files import atomic_write_text
from schedule_search.train.config import TrainConfig
from schedule_search.train.loop import train
from schedule_search.train.session import LocalSession

__all__ = [
    "STAGING",
    "RaySession",
    "TrialSession",
    "record_placement",
    "train_in_trial",
    "worker_loop",
]

STAGING = ".staging"


class RaySession:
    """`log_dir`: the trial's folder (records); `run_dir`: its Ray Train run's (checkpoints)."""

    def __init__(self, log_dir: Path, run_dir: Path) -> None:
        context = ray.train.get_context()
        self.rank = context.get_world_rank()
        self.world_size = context.get_world_size()
        self.log_dir = log_dir
        self.run_dir = run_dir
        self._last_metrics: dict[str, Any] | None = None

    def device(self) -> torch.device:
        return ray.train.torch.get_device()

    def latest_state(self) -> dict[str, Any] | None:
        """The newest readable checkpoint in the run's folder (older ones if it is damaged).

        Not only the one Ray Train offers (`ray.train.get_checkpoint()`): Ray registers a
        checkpoint a moment after it lies complete in the run's folder, and a driver killed in
        between would have the trial start over from an older one, or from scratch.
        """
        found = ckpt.load_latest(self.run_dir)
        return None if found is None else found[1]

    def report(self, metrics: dict[str, Any], state: dict[str, Any] | None) -> None:
        self._last_metrics = metrics
        if self.rank != 0 or state is None:
            ray.train.report(metrics)
            return
        history = state["progress"]["history"]
        atomic_write_text(self.log_dir / "metrics.json", json.dumps(history, indent=1))
        # Staged in the trial's folder (not /tmp): a write cut short by a kill is visible there
        # and cleared by the next one; Ray registers a checkpoint only once it is uploaded.
        staging = self.log_dir / STAGING
        shutil.rmtree(staging, ignore_errors=True)
        ckpt.save_state(staging / "checkpoint", state)
        ray.train.report(
            metrics,
            checkpoint=ray.train.Checkpoint.from_directory(str(staging / "checkpoint")),
            checkpoint_dir_name=ckpt.folder_name(state["window"]["tokens_seen"]),
        )
        shutil.rmtree(staging, ignore_errors=True)

    def save(self, state: dict[str, Any]) -> None:
        """A checkpoint between evaluations, reported with the last evaluation's metrics
        (Tune needs the objective in every result; before the first there is none to give)."""
        if self._last_metrics is not None:
            self.report(self._last_metrics, state)


class TrialSession(LocalSession):
    """A one-worker CPU trial trained in the Tune trial's process: a local run whose
    checkpoints go to the run's folder (atomically, the newest `keep` kept, a write a kill cut
    short cleared at the next save) and whose results also go to Tune. A failed trial is
    retried by Tune (`tune.FailureConfig`) and resumes from that folder."""

    def __init__(self, log_dir: Path, run_dir: Path, keep: int) -> None:
        super().__init__(log_dir, keep, checkpoints=run_dir)

    def device(self) -> torch.device:
        return torch.device("cpu")

    def report(self, metrics: dict[str, Any], state: dict[str, Any] | None) -> None:
        super().report(metrics, state)
        tune.report(metrics)


def record_placement(log_dir: Path, rank: int, device: str) -> None:
    """Each rank writes where it runs (`workers/rank-<r>.json`): on a cluster, which node
    each trial's workers landed on; the device and the collective backend (gloo, NCCL; none
    for a trial trained in its own process)."""
    context = ray.get_runtime_context()
    placement = {
        "rank": rank,
        "node_id": context.get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "pid": os.getpid(),
        "device": device,
        "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else "",
    }
    atomic_write_text(log_dir / "workers" / f"rank-{rank}.json", json.dumps(placement))


def worker_loop(loop_config: dict[str, Any]) -> None:
    """What each Ray Train worker runs."""
    config = parse(TrainConfig, loop_config["config"], loop_config["source"])
    log_dir = Path(loop_config["log_dir"])
    log_dir.mkdir(parents=True, exist_ok=True)
    session = RaySession(log_dir, Path(loop_config["run_dir"]))
    record_placement(log_dir, session.rank, str(session.device()))
    train(config, session, loop_config["source"])


def train_in_trial(loop_config: dict[str, Any]) -> None:
    """What a one-worker CPU trial runs, in its own process (the same loop config)."""
    config = parse(TrainConfig, loop_config["config"], loop_config["source"])
    log_dir = Path(loop_config["log_dir"])
    log_dir.mkdir(parents=True, exist_ok=True)
    session = TrialSession(log_dir, Path(loop_config["run_dir"]), config.checkpoint.keep)
    record_placement(log_dir, 0, "cpu")
    train(config, session, loop_config["source"])
