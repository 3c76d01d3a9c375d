"""The durable record of how each trial ended, written the moment Tune says so."""

from __future__ import annotations

import time
from typing import Any, ClassVar

from ray import tune

from schedule_search.core.states import State
from schedule_search.sweep.experiment import Experiment
from schedule_search.sweep.failures import FailFast, error_line
from schedule_search.sweep.live_view import METRIC, LiveView
from schedule_search.sweep.records import read_records

__all__ = ["TrialRecorder"]


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
        history = read_records(self.experiment.trial_dir(trial.trial_id)).history
        resumed_from = history[-1].chinchilla if history else 0.0
        self.progress.started(trial.trial_id, trial.config, resumed_from)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.progress.result(trial.trial_id, trial.config, result)

    def on_trial_complete(self, iteration, trials, trial, **info):
        result = trial.last_result or {}
        if result.get("status") == State.DIVERGED:
            state, reason = State.DIVERGED, result.get("reason", "")
        elif result.get("status") == State.COMPLETED:
            state, reason = State.COMPLETED, ""
        else:
            state, reason = State.STOPPED, "stopped early by ASHA"
        self._record(trial, state, reason, result)

    def on_trial_error(self, iteration, trials, trial, **info):
        """Called once Tune's retries are spent."""
        result = trial.last_result or {}
        reason = error_line(trial.error_file)
        self._record(trial, State.ERROR, reason, result, {"error_file": str(trial.error_file)})
        if "chinchilla" not in result:  # failed to start on every attempt: so will the rest
            self.fail_fast.reason = (
                f"trial {trial.trial_id} failed before its first evaluation on every attempt: "
                f"{reason}"
            )

    def _record(
        self, trial, state: State, reason: str, result: dict, extra: dict | None = None
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
        self.progress.finished(
            trial_id, trial.config, state, reason if state == State.ERROR else ""
        )
