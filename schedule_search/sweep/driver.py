"""The sweep: Ray Tune + OptunaSearch (TPE, seeded) + ASHA over core-trainer trials (on Ray Train
workers; one CPU worker in the trial's own process); resume.

ASHA's clock is the Chinchilla multiple the trial has reached (`chinchilla`), which keeps
rising across a resumed trial, unlike `training_iteration`. Trials reserve a `trial_slot`
resource, so no more trials start than there are CPUs for their workers, and no trial waits
forever for workers. The pieces: `trial` (what a trial runs), `recorder` (how it ended),
`searcher` (what picks and stops trials), `ray_env` (the Ray it all runs on).
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from typing import Any

from ray import tune

from schedule_search.core.config import ConfigError
from schedule_search.core.interrupts import Interrupted, graceful_stop, quiet
from schedule_search.store.experiment import Experiment, SweepSettings
from schedule_search.store.facts import read_facts
from schedule_search.sweep.failures import FailFast, TrialsFailed, raise_if_trials_cannot_run
from schedule_search.sweep.live_view import LiveView
from schedule_search.sweep.optuna_study import write_optuna_mirror
from schedule_search.sweep.ray_env import ray_session, trial_driver_resources
from schedule_search.sweep.recorder import TrialRecorder
from schedule_search.sweep.searcher import scheduler, searcher
from schedule_search.sweep.space import load_space, trial_config
from schedule_search.sweep.trial import SpaceTrials, run_trial
from schedule_search.sweep.tune_storage import tune_filesystem
from schedule_search.train.config import TrainConfig

__all__ = ["restore_tuner", "run_tune", "sweep"]


def sweep(settings: SweepSettings, experiment: Experiment, resume: bool = False) -> None:
    """Run (or resume) the sweep in `experiment`, whose folder (space.yaml, sweep.json) the CLI
    has laid out. The folder is wherever it is now: moved, copied or renamed since it was
    launched, it is resumed and recorded there (`TrialRecorder`)."""
    space = load_space(experiment.root / "space.yaml")
    facts = read_facts(experiment.root)
    horizon = facts.horizon
    tune_config = tune.TuneConfig(
        search_alg=searcher(space),
        scheduler=scheduler(space, horizon, facts.milestones),
        num_samples=settings.samples,
        max_concurrent_trials=settings.concurrency,
        reuse_actors=settings.in_process,  # see `SweepSettings.in_process`
    )
    resolve = SpaceTrials(space, str(experiment.root / "space.yaml"))
    if resume:
        _known_trial_ids(experiment)  # damaged Tune state is refused before Ray starts
    experiment.log_driver("started", resume=resume)
    with ray_session(settings, trial_config(space, {}).task, experiment.root):
        live_view = LiveView(
            settings.samples, settings.samples * horizon, lambda params: (0.0, horizon)
        )
        run_tune(experiment, settings, resolve, tune_config, None, live_view, resume)
    try:
        experiment.log_driver("ended")
        experiment.write_table()
        write_optuna_mirror(experiment, space)
    except OSError as err:  # a full or read-only volume, which may also be why Tune ended
        raise TrialsFailed(f"the experiment folder cannot be written: {err}") from None


def _known_trial_ids(experiment: Experiment) -> set[str]:
    """Trial ids in Tune's newest experiment snapshot (each trial is a JSON string in it).
    A damaged snapshot, or a damaged searcher state beside it, is a ConfigError: Tune would
    print a traceback, and for the searcher's state hang. The callbacks' state (the live
    view's) is checked the same way."""
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
    pickles = ("searcher-state-*.pkl", "callback-states-*.pkl")
    for state in (path for pattern in pickles for path in experiment.tune_dir.glob(pattern)):
        try:
            with open(state, "rb") as handle:
                pickle.load(handle)
        except Exception as err:  # whatever unpickling garbage raises
            raise ConfigError(f"{state}: damaged ({err.__class__.__name__}); {advice}") from None
    return known


def restore_tuner(experiment: Experiment, trainable: Any) -> tune.Tuner:
    """Tune's snapshot of `experiment` restored to continue: unfinished and errored trials run
    again. Quiet, because restoring reads every trial's results, and a trial killed after Tune
    saw its first report but before its result files were written whole (`tune_storage`)
    has none yet, which Tune logs as a failure to fetch its metrics: noise, not a failure (the
    trial's own records are what the sweep reads)."""
    with quiet("ray.tune"):
        return tune.Tuner.restore(
            str(experiment.tune_dir),
            trainable=trainable,
            resume_unfinished=True,
            resume_errored=True,
            storage_filesystem=tune_filesystem(),
        )


def run_tune(
    experiment: Experiment,
    settings: SweepSettings,
    resolve: Callable[[dict[str, Any], str], TrainConfig],
    tune_config: tune.TuneConfig,
    param_space: dict[str, Any] | None,
    live_view: LiveView,
    resume: bool,
    set_aside_orphans: bool = True,
) -> None:
    """Run (or restore and continue) one Tune experiment of core-trainer trials.

    A restored Tune starts again, under their ids, the trials its last snapshot (taken each
    second) had not seen end. A searcher suggests other params for them, so their folders
    are moved aside first (`set_aside_orphans`). A grid (a transfer round) gives each id the
    same run again, so its folders stay: one that finished reports its record, an unfinished
    one resumes from its checkpoint."""
    driver = tune.with_parameters(
        run_trial, settings=settings, resolve=resolve, root=str(experiment.root)
    )
    driver = tune.with_resources(driver, trial_driver_resources(settings))
    filesystem = tune_filesystem()
    if resume and tune.Tuner.can_restore(str(experiment.tune_dir), filesystem):
        known = _known_trial_ids(experiment)  # a damaged snapshot is refused either way
        orphans = experiment.reconcile(known) if set_aside_orphans else []
        if orphans:
            print(
                f"moved aside {len(orphans)} trial(s) started after Tune's last snapshot: "
                f"{', '.join(orphans)} (in trials/.orphaned/; their work is resumed if "
                "their config is suggested again)",
                flush=True,
            )
        tuner = restore_tuner(experiment, driver)
    else:
        fail_fast = FailFast()
        tuner = tune.Tuner(
            driver,
            param_space=param_space,
            tune_config=tune_config,
            run_config=tune.RunConfig(
                name=experiment.tune_dir.name,
                storage_path=str(experiment.root),
                storage_filesystem=filesystem,
                failure_config=tune.FailureConfig(max_failures=settings.max_failures),
                callbacks=[TrialRecorder(live_view, fail_fast)],
                stop=fail_fast,
                verbose=0,
            ),
        )
    FailFast.take_reason()  # a reason left by an earlier run in this process is not ours
    with graceful_stop() as stop, quiet("ray.tune"):
        tuner.fit()
    if stop.number is not None:
        raise Interrupted(stop.number)
    raise_if_trials_cannot_run(experiment)
    # A stop whose cause the records cannot show: a trial's end that could not be written.
    if (reason := FailFast.take_reason()) is not None:
        raise TrialsFailed(reason)
