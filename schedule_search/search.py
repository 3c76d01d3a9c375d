"""The sweep: Ray Tune + OptunaSearch (TPE, seeded) + ASHA over Ray Train trials; resume.

One Tune trial is a small driver function that builds a `TorchTrainer` running the core
trainer on W workers (RAY_NOTES: Train V2 inside Tune). ASHA's clock is the Chinchilla multiple
the trial has reached (`chinchilla`), which keeps rising across a resumed trial, unlike
`training_iteration`. Trials reserve a `trial_slot` resource, so no more trials start than
there are CPUs for their workers, and no trial waits forever for workers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import pickle
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import ray
import ray.train
from optuna.trial import TrialState
from ray import tune
from ray.train.torch import TorchConfig, TorchTrainer
from ray.tune.integration.ray_train import TuneReportCallback
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
from ray.tune.search.optuna import OptunaSearch

from schedule_search.config import ConfigError, to_dict
from schedule_search.experiment import Experiment, SweepSettings, train_run_name
from schedule_search.failures import FailFast, error_line, raise_if_trials_cannot_run
from schedule_search.interrupts import Interrupted, graceful_stop, quiet
from schedule_search.launch import free_port
from schedule_search.optuna_study import (
    make_sampler,
    optuna_distributions,
    trial_state,
    write_optuna_mirror,
)
from schedule_search.progress import METRIC, LiveView
from schedule_search.ray_session import worker_loop
from schedule_search.space import SearchSpace, load_space, trial_config, uses_asha
from schedule_search.tasks import task_code
from schedule_search.train import TrainConfig


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
    """The Tune trainable: one trial = one Ray Train run of the core trainer."""
    experiment = Experiment(root)
    trial_id = tune.get_context().get_trial_id()
    ended = experiment.read_trial_json(trial_id, "result.json")
    history = experiment.read_trial_json(trial_id, "metrics.json")
    if ended and ended["state"] in ("completed", "diverged", "stopped") and history:
        # It ended after Tune's last snapshot: our durable record has its result; report it
        # again rather than start a worker group for it.
        tune.report(history[-1])
        return
    config = resolve(params, trial_id)
    train_run = train_run_name(to_dict(config))
    experiment.write_trial_json(
        trial_id,
        "config.json",
        {"params": params, "config": to_dict(config), "train_run": train_run},
    )
    use_gpu = settings.gpus_per_worker > 0
    resources = {"CPU": settings.cpus_per_worker}
    if use_gpu:
        resources["GPU"] = settings.gpus_per_worker
    trainer = TorchTrainer(
        worker_loop,
        train_loop_config={
            "config": to_dict(config),
            "log_dir": str(experiment.trial_dir(trial_id)),
            "run_dir": str(experiment.train_dir / train_run),
            "source": f"trial {trial_id}",
        },
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


class TrialRecorder(tune.Callback):
    """Writes each trial's end (completed, stopped early, diverged, error) into its folder, as
    soon as it happens: a durable record that does not wait for Tune's next snapshot."""

    #: The experiment a driver is restoring Tune into. Tune pickles its callbacks with its
    #: state, experiment path included; a folder moved or renamed since would have its trials
    #: recorded at the old place. Unpickling re-points the recorder to the folder resumed.
    restoring_into: ClassVar[Experiment | None] = None

    def __init__(self, experiment: Experiment, progress: LiveView, fail_fast: FailFast) -> None:
        self.experiment = experiment
        self.progress = progress
        self.fail_fast = fail_fast
        self.started: dict[str, float] = {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if TrialRecorder.restoring_into is not None:
            self.experiment = TrialRecorder.restoring_into

    def on_trial_start(self, iteration, trials, trial, **info):
        self.started[trial.trial_id] = time.monotonic()
        history = self.experiment.read_trial_json(trial.trial_id, "metrics.json") or []
        resumed_from = history[-1]["chinchilla"] if history else 0.0
        self.progress.started(trial.trial_id, trial.config, resumed_from)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.progress.result(trial.trial_id, trial.config, result)

    def on_trial_complete(self, iteration, trials, trial, **info):
        result = trial.last_result or {}
        if result.get("status") == "diverged":
            state, reason = "diverged", result.get("reason", "")
        elif result.get("status") == "completed":
            state, reason = "completed", ""
        else:
            state, reason = "stopped", "stopped early by ASHA"
        self._record(trial, state, reason, result)

    def on_trial_error(self, iteration, trials, trial, **info):
        """Called once Tune's retries are spent."""
        result = trial.last_result or {}
        reason = error_line(trial.error_file)
        self._record(trial, "error", reason, result, {"error_file": str(trial.error_file)})
        if "chinchilla" not in result:  # failed to start on every attempt: so will the rest
            self.fail_fast.reason = (
                f"trial {trial.trial_id} failed before its first evaluation on every attempt: "
                f"{reason}"
            )

    def _record(
        self, trial, state: str, reason: str, result: dict, extra: dict | None = None
    ) -> None:
        trial_id = trial.trial_id
        started = self.started.pop(trial_id, None)
        earlier = self.experiment.read_trial_json(trial_id, "result.json")
        if earlier is not None and earlier.get("state") == state:
            self.progress.finished(trial_id, trial.config, state)
            return  # recorded before a restart: keep the original record
        record = {"state": state, "reason": reason, "val_loss": result.get(METRIC)}
        if "milestone" in result:
            # Where the searcher last heard of the trial: a STOP arrives after the result that
            # caused it, and a short trial may train on past it; records past this point are
            # not the trial's result (Experiment.rows reads up to here).
            record["milestone"] = result["milestone"]
        if started is not None:  # seconds this driver saw the trial run (this attempt)
            record["trial_s"] = time.monotonic() - started
        self.experiment.write_trial_json(trial_id, "result.json", record | (extra or {}))
        self.progress.finished(trial_id, trial.config, state, reason if state == "error" else "")


class MilestoneOptunaSearch(OptunaSearch):
    """Ray's OptunaSearch, told what the journal records (`optuna_study.trial_state`).

    Ray's own reports every result as an intermediate value at Tune's `training_iteration`,
    which restarts at 1 when a restored trial runs again, and tells a trial the scheduler
    stopped as COMPLETE with its loss at the rung where it stopped, ranked among losses at the
    horizon. Here an intermediate value's step is the evaluation's milestone index (it keeps
    rising across resumes), and a stopped trial is PRUNED."""

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if isinstance(self.metric, list) or trial_id in self._completed_trials:
            return  # Optuna keeps no intermediate values for multi-objective studies
        trial = self._ot_trials.get(trial_id)
        if trial is None or "milestone" not in result:
            return
        reported = self.__dict__.setdefault("_steps_reported", {}).setdefault(trial_id, set())
        step = int(result["milestone"])
        if step not in reported:  # a resumed trial reports its last milestone again
            trial.report(float(result[self.metric]), step)
            reported.add(step)

    def on_trial_complete(
        self, trial_id: str, result: dict | None = None, error: bool = False
    ) -> None:
        if error or not result or trial_id in self._completed_trials:
            super().on_trial_complete(trial_id, result, error)
            return
        # A scheduler's STOP hands the last result only here, not to `on_trial_result`.
        self.on_trial_result(trial_id, result)
        status = result.get("status")
        row_state = status if status in ("completed", "diverged") else "stopped"
        metrics = self.metric if isinstance(self.metric, list) else [self.metric]
        values = [float(result.get(m, math.nan)) for m in metrics]
        state = trial_state(row_state, values)
        told = values if len(values) > 1 else values[0]
        assert self._ot_study is not None  # set up before any trial starts
        self._ot_study.tell(
            self._ot_trials[trial_id], told if state == TrialState.COMPLETE else None, state=state
        )
        self._completed_trials.add(trial_id)


def _searcher(space: SearchSpace) -> OptunaSearch:
    distributions = optuna_distributions(space)
    multi = len(space.objectives) > 1
    return MilestoneOptunaSearch(
        space=distributions,
        metric=list(space.objectives) if multi else METRIC,
        mode=["min"] * len(space.objectives) if multi else "min",
        points_to_evaluate=space.points_to_evaluate or None,
        sampler=make_sampler(space.sampler, space.seed, space.startup_trials),
    )


def _scheduler(space: SearchSpace, horizon: float, milestones: list[float]):
    if not uses_asha(space):
        return FIFOScheduler()
    grace = 1.0 if 1.0 in milestones else milestones[0]
    # ASHA's rungs are compared with `time_attr`, here Chinchilla multiples (floats), although
    # its signature says int.
    return ASHAScheduler(
        time_attr="chinchilla",
        metric=METRIC,
        mode="min",
        max_t=horizon,  # type: ignore[arg-type]
        grace_period=grace,  # type: ignore[arg-type]
        reduction_factor=2,
    )


#: Set (unless the user set them) before Ray starts or is connected to. Tune reads the first
#: two; Ray Train's controllers read the next two, and Tune passes them on to its trials, on a
#: cluster too. A snapshot every second so a killed driver forgets as little as possible.
DRIVER_ENVIRONMENT = {
    "TUNE_GLOBAL_CHECKPOINT_S": "1",
    "RAY_AIR_NEW_OUTPUT": "0",  # Tune's classic reporter; the live view is ours
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",  # reports are not delayed by 2 s polls
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_CHDIR_TO_TRIAL_DIR": "0",  # trials keep the driver's working directory
}
#: Only for the Ray a sweep starts itself: a private instance on 127.0.0.1 needs no token. A
#: cluster's authentication is the cluster's: left as it is.
LOCAL_ENVIRONMENT = {"RAY_AUTH_MODE": "disabled"}


def ray_environment(address: str | None) -> dict[str, str]:
    """The variables a sweep sets before Ray starts (`address` None) or is connected to."""
    return DRIVER_ENVIRONMENT | ({} if address else LOCAL_ENVIRONMENT)


def _init_ray(settings: SweepSettings, code: Path | None) -> None:
    for name, value in ray_environment(settings.address).items():
        os.environ.setdefault(name, value)
    if settings.address:
        # A cluster's workers have neither the driver's PYTHONPATH nor its working directory:
        # the user's task module travels with the job.
        ray.init(
            address=settings.address,
            runtime_env={"py_modules": [str(code)]} if code else None,
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
    else:
        ray.init(
            address="local",  # a new Ray of its own, even beside a `ray start` cluster here
            num_cpus=os.cpu_count(),
            resources={"trial_slot": settings.concurrency},
            dashboard_port=_pin_state_api(),
            logging_level=logging.WARNING,
            log_to_driver=False,
        )


def _pin_state_api() -> int:
    """A port for the local Ray's dashboard, named to every process of that Ray.

    Ray Train's placement-group cleaner asks the State API (the dashboard) whether a trial's
    controller is dead, and finds it by auto-detecting "the" local Ray: with a second Ray on
    the machine that lookup raises, the cleaner's thread dies, and a trial stopped early never
    frees its workers (the sweep then waits forever). Naming the API server in the
    environment the local Ray's processes inherit (`RAY_API_SERVER_ADDRESS`, which the
    lookup reads first) keeps each Ray's cleaner on its own Ray.
    """
    port = free_port()
    os.environ["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{port}"
    return port


def sweep(settings: SweepSettings, experiment: Experiment, resume: bool = False) -> None:
    """Run (or resume) the sweep in `experiment`, whose folder (space.yaml, sweep.json) the CLI
    has laid out. The folder is wherever it is now: moved, copied or renamed since it was
    launched, it is resumed and recorded there (`TrialRecorder.restoring_into`)."""
    space = load_space(experiment.root / "space.yaml")
    base = trial_config(space, {})
    horizon = base.budget.horizon
    tune_config = tune.TuneConfig(
        search_alg=_searcher(space),
        scheduler=_scheduler(space, horizon, base.budget.milestones()),
        num_samples=settings.samples,
        max_concurrent_trials=settings.concurrency,
    )
    resolve = SpaceTrials(space, str(experiment.root / "space.yaml"))
    experiment.log_driver("started", resume=resume)
    with ray_session(settings, base.task):
        progress = LiveView(
            settings.samples, settings.samples * horizon, lambda params: (0.0, horizon)
        )
        run_tune(experiment, settings, resolve, tune_config, None, progress, resume)
    experiment.log_driver("ended")
    experiment.write_table(horizon)
    write_optuna_mirror(experiment, space)


def _known_trial_ids(experiment: Experiment) -> set[str]:
    """Trial ids in Tune's newest experiment snapshot (each trial is a JSON string in it).
    A damaged snapshot, or a damaged searcher state beside it, is a ConfigError: Tune would
    print a traceback, and for the searcher's state hang."""
    states = sorted(experiment.tune_dir.glob("experiment_state-*.json"))
    if not states:
        return set()
    advice = (
        "Tune cannot resume from it; put back a copy of the tune/ folder, or start the space "
        "again under a new --name (trials/ keeps every finished trial's records)"
    )
    try:
        snapshot = json.loads(states[-1].read_text())
        known = {json.loads(entry[0])["trial_id"] for entry in snapshot["trial_data"]}
    except (OSError, ValueError, KeyError, TypeError, IndexError) as err:
        raise ConfigError(f"{states[-1]}: damaged ({err.__class__.__name__}); {advice}") from None
    for state in experiment.tune_dir.glob("searcher-state-*.pkl"):
        try:
            with open(state, "rb") as handle:
                pickle.load(handle)
        except Exception as err:  # whatever unpickling garbage raises
            raise ConfigError(f"{state}: damaged ({err.__class__.__name__}); {advice}") from None
    return known


def _trial_driver_resources() -> dict[str, float]:
    """What a trial's driver (not its workers) reserves. Tune refuses a trial of no resources:
    a local Ray is started with `trial_slot` resources (one per concurrent trial); a cluster
    that declares them (`ray start --resources '{"trial_slot": K}'`) is used the same way, and
    on one that does not, a trial reserves a hundredth of a CPU."""
    if ray.cluster_resources().get("trial_slot", 0) >= 1:
        return {"cpu": 0, "trial_slot": 1}
    return {"cpu": 0.01}


@contextlib.contextmanager
def ray_session(settings: SweepSettings, task: dict[str, Any]) -> Iterator[None]:
    """A local Ray (or a connection to the cluster at `settings.address`, which is sent the
    code of the user's `task`), always shut down."""
    pinned = os.environ.get("RAY_API_SERVER_ADDRESS")
    _init_ray(settings, task_code(task))
    try:
        yield
    finally:
        ray.shutdown()
        if pinned is None:
            os.environ.pop("RAY_API_SERVER_ADDRESS", None)
        else:
            os.environ["RAY_API_SERVER_ADDRESS"] = pinned


def run_tune(
    experiment: Experiment,
    settings: SweepSettings,
    resolve: Callable[[dict[str, Any], str], TrainConfig],
    tune_config: tune.TuneConfig,
    param_space: dict[str, Any] | None,
    progress: LiveView,
    resume: bool,
) -> None:
    """Run (or restore and continue) one Tune experiment of core-trainer trials."""
    driver = tune.with_parameters(
        run_trial, settings=settings, resolve=resolve, root=str(experiment.root)
    )
    driver = tune.with_resources(driver, _trial_driver_resources())
    if resume and tune.Tuner.can_restore(str(experiment.tune_dir)):
        orphans = experiment.reconcile(_known_trial_ids(experiment))
        if orphans:
            print(
                f"moved aside {len(orphans)} trial(s) started after Tune's last snapshot: "
                f"{', '.join(orphans)} (in trials/.orphaned/; their work is resumed if "
                "their config is suggested again)",
                flush=True,
            )
        TrialRecorder.restoring_into = experiment
        try:
            tuner = tune.Tuner.restore(
                str(experiment.tune_dir),
                trainable=driver,
                resume_unfinished=True,
                resume_errored=True,
            )
        finally:
            TrialRecorder.restoring_into = None
    else:
        fail_fast = FailFast()
        tuner = tune.Tuner(
            driver,
            param_space=param_space,
            tune_config=tune_config,
            run_config=tune.RunConfig(
                name=experiment.tune_dir.name,
                storage_path=str(experiment.root),
                failure_config=tune.FailureConfig(max_failures=settings.max_failures),
                callbacks=[TrialRecorder(experiment, progress, fail_fast)],
                stop=fail_fast,
                verbose=0,
            ),
        )
    with graceful_stop() as stop, quiet("ray.tune"):
        tuner.fit()
    if stop.number is not None:
        raise Interrupted(stop.number)
    raise_if_trials_cannot_run(experiment)
