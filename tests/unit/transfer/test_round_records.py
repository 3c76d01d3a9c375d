"""What a replayed transfer round reads back from its records: the runs that ended for good are
kept; a run that errored is pending again, so the resume that retries it can resolve its name."""

from schedule_search.store.experiment import Experiment
from schedule_search.transfer.run import ended_runs


def test_only_runs_that_ended_for_good_are_kept_and_an_error_runs_again(tmp_path):
    phase = Experiment(tmp_path / "round1")
    endings = {
        "recipe": "completed",
        "cosine-1x-lr0.1": "diverged",
        "wsd-2x": "stopped",
        "constant": "error",
        "cosine-1x-lr0.2": None,  # started, killed before it ended
    }
    for number, (run, state) in enumerate(endings.items()):
        trial_id = f"0000{number}"
        phase.write_trial_json(trial_id, "config.json", {"params": {"run": run}, "config": {}})
        if state is not None:
            phase.write_trial_json(trial_id, "result.json", {"state": state})
    assert sorted(ended_runs(phase)) == ["cosine-1x-lr0.1", "recipe", "wsd-2x"]
    assert ended_runs(Experiment(tmp_path / "round2")) == []  # a round not begun
