"""The live view's counts and ETA, driven with a hand-set clock (its only input besides the
events Tune reports)."""

import pytest

from schedule_search.sweep.live_view import LiveView


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_counts_best_and_eta_of_a_sweep(capsys):
    clock = Clock()
    view = LiveView(total=3, planned_units=12.0, span=lambda params: (0.0, 4.0), wall_clock=clock)
    assert view.eta_s() is None  # no rate yet
    view.started("a", {"lr": 0.1}, resumed_from=0.0)
    clock.now = 10.0
    view.result("a", {"lr": 0.1}, {"chinchilla": 1.0, "val_loss": 2.0, "tokens_per_s": 5e4})
    # 1 unit in 10 s; 11 units left (a has 3 to go, two trials of 4 wait)
    assert view.remaining_units() == pytest.approx(11.0)
    assert view.eta_s() is None  # 1 of 12 units and no trial ended: the rate is start-up
    assert view.status_line().endswith("ETA after more results")
    view.finished("a", {"lr": 0.1}, "stopped")  # stopped at 1x: it will not train 1x-4x
    assert view.remaining_units() == pytest.approx(8.0)
    assert view.eta_s() == pytest.approx(80.0)  # a trial ended: 8 units at 1 per 10 s
    view.started("b", {"lr": 0.2}, resumed_from=2.0)  # resumed: its first 2 units were done before
    clock.now = 20.0
    view.result("b", {"lr": 0.2}, {"chinchilla": 4.0, "val_loss": 1.5, "tokens_per_s": 6e4})
    assert view.units_this_session == pytest.approx(3.0)  # 1 (a) + 2 (b from 2x to 4x)
    view.finished("b", {"lr": 0.2}, "completed")
    assert view.remaining_units() == pytest.approx(4.0)
    line = view.status_line()
    assert "1 completed" in line and "1 stopped" in line and "1 waiting" in line
    assert "best 1.5000 (trial b: lr=0.2)" in line
    assert "ETA <= 0m27s" in line  # 4 units at 3 units per 20 s
    out = capsys.readouterr().out
    assert "trial a: 1x  val_loss 2.0000  50,000 tok/s" in out


def test_branches_count_only_the_part_they_train():
    clock = Clock()
    spans = {"wsd-4x": (3.6, 4.0), "wsd-8x": (7.2, 8.0)}
    view = LiveView(2, 0.4 + 0.8, lambda p: spans[p["run"]], wall_clock=clock)
    view.started("x", {"run": "wsd-8x"}, resumed_from=0.0)
    clock.now = 8.0
    view.result("x", {"run": "wsd-8x"}, {"chinchilla": 8.0, "val_loss": 1.0})
    assert view.units_this_session == pytest.approx(0.8)
    assert view.remaining_units() == pytest.approx(0.4)
    assert view.eta_s() == pytest.approx(4.0)


def test_a_view_restored_by_tune_keeps_its_trials_and_restarts_its_clock():
    from ray import cloudpickle  # what Tune saves its callbacks with

    view = LiveView(2, 8.0, lambda p: (0.0, 4.0))
    view.started("a", {}, 0.0)
    view.result("a", {}, {"chinchilla": 2.0, "val_loss": 1.0})
    view.started_at -= 3600  # an hour ago, in the driver that died
    restored = cloudpickle.loads(cloudpickle.dumps(view))
    assert restored.trials.keys() == {"a"} and restored.trials["a"].reached == 2.0
    assert restored.units_this_session == 0.0 and restored.eta_s() is None
    assert restored.status_line().startswith("[0m0")


def test_a_restored_recorder_takes_back_the_view_of_the_trials_seen():
    """Tune restores its callbacks from the pickle written at launch, then hands each the state
    it saved with its last snapshot: the recorder's view comes back with the trials that
    ended before the stop (not counted as waiting)."""
    from ray import cloudpickle

    from schedule_search.sweep.failures import FailFast
    from schedule_search.sweep.recorder import TrialRecorder

    view = LiveView(2, 8.0, lambda p: (0.0, 4.0))
    view.started("a", {}, 0.0)
    view.result("a", {}, {"chinchilla": 4.0, "val_loss": 1.0})
    view.finished("a", {}, "completed")
    at_launch = TrialRecorder(LiveView(2, 8.0, lambda p: (0.0, 4.0)), FailFast())
    restored = cloudpickle.loads(cloudpickle.dumps(at_launch))
    saved = TrialRecorder(view, FailFast()).get_state()
    restored.set_state(cloudpickle.loads(cloudpickle.dumps(saved)))
    line = restored.live_view.status_line()
    assert "1 completed" in line and "1 waiting" in line and "best 1.0000" in line, line


def test_a_trial_resumed_by_a_new_driver_says_so_and_counts_from_its_checkpoint(capsys):
    """A resumed transfer's runs report nothing until their next evaluation (the longest, an
    hour apart): the view says at once which run goes on, and from where."""
    from ray import cloudpickle

    view = LiveView(1, 32.0, lambda p: (0.0, 32.0))
    view.started("a", {}, 0.0)
    view.result("a", {}, {"chinchilla": 16.0, "val_loss": 1.0})
    restored = cloudpickle.loads(cloudpickle.dumps(view))
    capsys.readouterr()
    restored.started("a", {}, resumed_from=8.0)  # its newest checkpoint: 8x
    out = capsys.readouterr().out
    assert "trial a resumed from 8x" in out and "1 running" in out, out
    assert restored.remaining_units() == pytest.approx(24.0)
