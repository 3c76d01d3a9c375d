"""`transfer --reuse FOLDER`: a run the new plan asks for under the same name and config, ended
in the earlier transfer, is copied whole into the round that plans it (records, and its
checkpoints as hard links), and read back as any run that ended there; nothing else is."""

import json
import os

import pytest
from test_transfer_plan import study

from schedule_search.core.config import ConfigError
from schedule_search.store.experiment import Experiment
from schedule_search.transfer.reuse import copy_ended_runs, read_donor
from schedule_search.transfer.run import ended_runs, run_names


def ended_earlier(folder, trial_id, run, config, state="completed"):
    """A run of an earlier transfer's round 1, with one checkpoint; `state` None: unfinished."""
    phase = Experiment(folder / "round1")
    record = {"params": {"run": run}, "config": config, "train_run": f"run-{trial_id}"}
    phase.write_trial_json(trial_id, "config.json", record)
    phase.write_trial_json(trial_id, "metrics.json", [])
    (phase.trial_dir(trial_id) / "events.jsonl").write_text('{"event": "started"}\n')
    if state is not None:
        phase.write_trial_json(trial_id, "result.json", {"state": state})
    checkpoint = phase.train_dir / f"run-{trial_id}" / "checkpoint_000000000000100"
    checkpoint.mkdir(parents=True)
    (checkpoint / "state.pt").write_bytes(b"weights")
    return checkpoint / "state.pt"


def test_only_runs_of_the_same_name_and_config_that_ended_are_copied(tmp_path):
    s = study(methods=["recipe", "cosine"])
    pending = s.pending({}, lambda run, multiple: tmp_path)
    earlier = tmp_path / "transfer.before"
    weights = ended_earlier(earlier, "a_00000", "recipe", pending["recipe"])
    other_lr = dict(pending["cosine-1x-lr0.1"], optimizer={"name": "sgd", "lr": 0.3})
    ended_earlier(earlier, "a_00001", "cosine-1x-lr0.1", other_lr)  # another config
    ended_earlier(earlier, "a_00002", "cosine-1x-lr0.05", pending["cosine-1x-lr0.05"], None)
    ended_earlier(earlier, "a_00003", "cosine-1x-lr0.2", pending["cosine-1x-lr0.2"], "diverged")
    phase = Experiment(tmp_path / "transfer" / "round1")

    copied = copy_ended_runs(phase, pending, read_donor(earlier))
    assert sorted(copied) == ["cosine-1x-lr0.2", "recipe"]  # a diverged run ended too
    assert sorted(ended_runs(phase)) == sorted(copied)  # read back as runs that ended here
    assert run_names(phase) == {"recipe": "a_00000", "cosine-1x-lr0.2": "a_00003"}
    events = (phase.trial_dir("a_00000") / "events.jsonl").read_text().splitlines()
    assert json.loads(events[-1]) == {
        "event": "reused",
        "from": str(weights.parents[3] / "trials" / "a_00000"),
    }
    copy = phase.train_run_dir("a_00000") / "checkpoint_000000000000100" / "state.pt"
    assert copy.read_bytes() == b"weights"
    assert os.stat(copy).st_ino == os.stat(weights).st_ino  # a hard link, not a copy
    assert not (phase.root / ".reusing").exists() or not any((phase.root / ".reusing").iterdir())
    # The earlier transfer is left as it was.
    assert "reused" not in (earlier / "round1" / "trials" / "a_00000" / "events.jsonl").read_text()
    # Run again (a resumed round), nothing is copied twice.
    rest = {n: c for n, c in pending.items() if n not in copied}
    assert copy_ended_runs(phase, rest, read_donor(earlier)) == []


def test_a_copy_cut_short_is_made_again_and_never_read(tmp_path):
    s = study(methods=["recipe"])
    pending = s.pending({}, lambda run, multiple: tmp_path)
    earlier = tmp_path / "transfer.before"
    ended_earlier(earlier, "a_00000", "recipe", pending["recipe"])
    phase = Experiment(tmp_path / "transfer" / "round1")
    cut_short = phase.root / ".reusing" / "a_00000"
    cut_short.mkdir(parents=True)
    (cut_short / "config.json").write_text("{")  # killed mid-copy
    assert ended_runs(phase) == []  # a partial copy is no trial of the round
    assert copy_ended_runs(phase, pending, read_donor(earlier)) == ["recipe"]
    assert phase.read_trial_json("a_00000", "config.json")["params"] == {"run": "recipe"}


def test_a_folder_that_is_no_transfer_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="expected the folder of an earlier transfer"):
        read_donor(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"--reuse .*empty: expected the folder"):
        read_donor(tmp_path / "empty")
