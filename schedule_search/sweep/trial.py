"""One trial of a sweep, as Tune runs it: a small driver function that builds a Ray Train
`TorchTrainer` running the core trainer on the trial's workers (Ray Train V2 inside
Tune), or, for one CPU worker, runs the core trainer itself (`SweepSettings.in_process`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ray
import ray.train
from ray import tune
from ray.train.torch import TorchConfig, TorchTrainer
from ray.tune.integration.ray_train import TuneReportCallback

from schedule_search.core.config import to_dict
from schedule_search.core.states import KEPT
from schedule_search.store.experiment import Experiment, SweepSettings, train_run_name
from schedule_search.sweep.space import SearchSpace, trial_config
from schedule_search.sweep.worker import train_in_trial, worker_loop
from schedule_search.train.config import TrainConfig

__all__ = ["SpaceTrials", "run_trial"]


class SpaceTrials:
    """Turns a trial's sampled values into its training config."""

    def __init__(self, space: SearchSpace, source: str) -> None:
        self.space = space
        self.source = source

    def __call__(self, params: dict[str, Any], trial_id: str) -> TrainConfig:
        return trial_config(self.space, params, f"{self.source} (trial {trial_id})")


def run_trial(
    params: dict[str, Any],
    settings: SweepSettings,
    resolve: Callable[[dict[str, Any], str], TrainConfig],
    root: str,
) -> None:
    """The Tune trainable: one trial = one run of the core trainer (on Ray Train workers, or
    in this process for one CPU worker)."""
    experiment = Experiment(root)
    trial_id = tune.get_context().get_trial_id()
    ended = experiment.read_trial_json(trial_id, "result.json")
    history = experiment.read_trial_json(trial_id, "metrics.json")
    if ended and ended["state"] in KEPT and history:
        # It ended after Tune's last snapshot: our durable record has its result; report it
        # again rather than start a worker group for it.
        tune.report(history[-1])
        return
    config = resolve(params, trial_id)
    tree = to_dict(config)
    train_run = train_run_name(tree)
    experiment.write_trial_json(
        trial_id, "config.json", {"params": params, "config": tree, "train_run": train_run}
    )
    loop_config = {
        "config": tree,
        "log_dir": str(experiment.trial_dir(trial_id)),
        "run_dir": str(experiment.train_dir / train_run),
        "source": f"trial {trial_id}",
    }
    if settings.in_process:
        train_in_trial(loop_config)
        return
    use_gpu = settings.gpus_per_worker > 0
    resources = {"CPU": settings.cpus_per_worker}
    if use_gpu:
        resources["GPU"] = settings.gpus_per_worker
    trainer = TorchTrainer(
        worker_loop,
        train_loop_config=loop_config,
        scaling_config=ray.train.ScalingConfig(
            num_workers=settings.workers, use_gpu=use_gpu, resources_per_worker=resources
        ),
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        run_config=ray.train.RunConfig(
            name=train_run,
            storage_path=str(experiment.train_dir),
            # Tune's bridge for Train V2 runs inside a trial (typed as Train's own callback).
            callbacks=[TuneReportCallback()],  # type: ignore[list-item]
            failure_config=ray.train.FailureConfig(max_failures=settings.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=config.checkpoint.keep),
        ),
    )
    trainer.fit()
