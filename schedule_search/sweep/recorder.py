"""The durable record of how each trial ended, written the moment Tune says so."""

from __future__ import annotations

import time
from pathlib import Path

from ray import tune

from schedule_search.core.states import State
from schedule_search.store.experiment import Experiment
from schedule_search.store.records import METRIC, read_records
from schedule_search.sweep.failures import FailFast, error_line, unwritable_path
from schedule_search.sweep.live_view import LiveView

__all__ = ["TrialRecorder"]


class TrialRecorder(tune.Callback):
    """Writes each trial's end (completed, stopped early, diverged, error) into its folder, as
    soon as it happens: a durable record that does not wait for Tune's next snapshot.

    Tune pickles its callbacks once, at launch, so the recorder holds no path: it finds the
    experiment folder from each trial's Tune folder (`<experiment>/tune`), which Tune points
    at wherever the experiment is restored from. A folder moved or renamed since it was
    launched has its trials recorded where it is now. What the live view has seen since
    launch travels in `get_state`, which Tune saves with each snapshot."""

    def __init__(self, live_view: LiveView, fail_fast: FailFast) -> None:
        self.live_view = live_view
        self.fail_fast = fail_fast
        self.started: dict[str, float] = {}

    def get_state(self) -> dict:
        """Saved by Tune beside each experiment snapshot and handed to `set_state` on restore:
        without it a resumed driver's view starts from the launch-time pickle, counting trials
        that ended before the kill as waiting and their work as still to do."""
        return {"live_view": self.live_view}

    def set_state(self, state: dict) -> None:
        self.live_view = state["live_view"]

    @staticmethod
    def experiment_of(trial) -> Experiment:
        return Experiment(Path(trial.remote_experiment_path).parent)

    def on_trial_start(self, iteration, trials, trial, **info):
        self.started[trial.trial_id] = time.monotonic()
        history = read_records(self.experiment_of(trial).trial_dir(trial.trial_id)).history
        resumed_from = history[-1].chinchilla if history else 0.0
        self.live_view.started(trial.trial_id, trial.config, resumed_from)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.live_view.result(trial.trial_id, trial.config, result)

    def on_trial_complete(self, iteration, trials, trial, **info):
        result = trial.last_result or {}
        if result.get("status") == State.DIVERGED:
            state, reason = State.DIVERGED, result.get("reason", "")
        elif result.get("status") == State.COMPLETED:
            state, reason = State.COMPLETED, ""
        else:
            state, reason = State.STOPPED, "stopped early by ASHA"
        self._record(trial, state, reason, result)

    def on_trial_recover(self, iteration, trials, trial, **info):
        """Called when Tune is to retry a failed trial. A trial that failed because the
        experiment folder's volume is full or read-only ends the sweep instead, in one line:
        each retry would meet the same volume (a full one cost two retries of every running
        trial, each a new process, before the sweep ended), and a `resume` once there is room
        runs it again from its last checkpoint."""
        reason = error_line(trial.error_file)
        if unwritable_path(reason, self.experiment_of(trial).root):
            self.fail_fast.stop(
                f"trial {trial.trial_id} cannot write to the experiment folder: {reason}"
            )

    def on_trial_error(self, iteration, trials, trial, **info):
        """Called once Tune's retries are spent."""
        result = trial.last_result or {}
        reason = error_line(trial.error_file)
        self._record(trial, State.ERROR, reason, result, {"error_file": str(trial.error_file)})
        if "chinchilla" not in result:  # failed to start on every attempt: so will the rest
            self.fail_fast.stop(
                f"trial {trial.trial_id} failed before its first evaluation on every attempt: "
                f"{reason}"
            )

    def _record(
        self, trial, state: State, reason: str, result: dict, extra: dict | None = None
    ) -> None:
        trial_id = trial.trial_id
        started = self.started.pop(trial_id, None)
        experiment = self.experiment_of(trial)
        earlier = experiment.read_trial_json(trial_id, "result.json")
        if earlier is not None and earlier.get("state") == state:
            self.live_view.finished(trial_id, trial.config, state)
            return  # recorded before a restart: keep the original record
        record = {"state": state, "reason": reason, "val_loss": result.get(METRIC)}
        if "milestone" in result:
            # Where the searcher last heard of the trial: a STOP arrives after the result that
            # caused it, and a short trial may train on past it; records past this point are
            # not the trial's result (Experiment.rows reads up to here).
            record["milestone"] = result["milestone"]
        if started is not None:  # seconds this driver saw the trial run (this attempt)
            record["trial_s"] = time.monotonic() - started
        try:
            experiment.write_trial_json(trial_id, "result.json", record | (extra or {}))
        except OSError as err:  # a full or read-only volume: no trial can record its end
            self.fail_fast.stop(f"trial {trial_id}'s end could not be recorded: {err}")
            return
        self.live_view.finished(
            trial_id, trial.config, state, reason if state == State.ERROR else ""
        )
