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
from schedule_search.transfer.run import SHARED_HELD_OUT, ended_runs, run_names

LAUNCHED = {"workers": 1, "held_out": SHARED_HELD_OUT}


def ended_earlier(folder, trial_id, run, config, state="completed", round_number=1):
    """A run of an earlier transfer, with one checkpoint; `state` None: unfinished."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "launch.json").write_text(json.dumps(LAUNCHED))
    phase = Experiment(folder / f"round{round_number}")
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


def donor(folder):
    return read_donor(folder, LAUNCHED["workers"], LAUNCHED["held_out"])


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

    copied = copy_ended_runs(phase, pending, donor(earlier))
    assert sorted(copied) == ["cosine-1x-lr0.2", "recipe"]  # a diverged run ended too
    assert sorted(ended_runs(phase)) == sorted(copied)  # read back as runs that ended here
    # Under ids Tune never gives (its are hex): a trial Tune starts here cannot land on one.
    assert run_names(phase) == {"recipe": "reused-a_00000", "cosine-1x-lr0.2": "reused-a_00003"}
    events = (phase.trial_dir("reused-a_00000") / "events.jsonl").read_text().splitlines()
    source = earlier / "round1" / "trials" / "a_00000"
    assert json.loads(events[-1]) == {"event": "reused", "from": str(source)}
    copy = phase.train_run_dir("reused-a_00000") / "checkpoint_000000000000100" / "state.pt"
    assert copy.read_bytes() == b"weights"
    assert os.stat(copy).st_ino == os.stat(weights).st_ino  # a hard link, not a copy
    assert not (phase.root / ".reusing").exists()
    # The earlier transfer is left as it was.
    assert "reused" not in (source / "events.jsonl").read_text()
    # Asked again (a resumed round), nothing is copied twice.
    assert copy_ended_runs(phase, pending, donor(earlier)) == []
    # Nothing goes into a round Tune has started: its grid holds every run it was to train.
    started = Experiment(tmp_path / "transfer" / "round2")
    started.tune_dir.mkdir(parents=True)
    assert copy_ended_runs(started, pending, donor(earlier)) == []


def test_a_copy_cut_short_is_made_again_and_never_read(tmp_path):
    s = study(methods=["recipe"])
    pending = s.pending({}, lambda run, multiple: tmp_path)
    earlier = tmp_path / "transfer.before"
    ended_earlier(earlier, "a_00000", "recipe", pending["recipe"])
    phase = Experiment(tmp_path / "transfer" / "round1")
    cut_short = phase.root / ".reusing" / "reused-a_00000"
    cut_short.mkdir(parents=True)
    (cut_short / "config.json").write_text("{")  # killed mid-copy
    assert ended_runs(phase) == []  # a partial copy is no trial of the round
    assert copy_ended_runs(phase, pending, donor(earlier)) == ["recipe"]
    assert phase.read_trial_json("reused-a_00000", "config.json")["params"] == {"run": "recipe"}


def test_runs_that_cannot_stand_for_this_transfers_are_not_copied(tmp_path):
    """A run that ended in two rounds is ambiguous, one whose train folder is gone has no
    checkpoints to give: neither is copied. A transfer scored per seed on its own held-out
    sample, or trained on another number of workers, is refused whole, in one line."""
    s = study(methods=["cosine"])
    pending = s.pending({}, lambda run, multiple: tmp_path)
    earlier = tmp_path / "transfer.before"
    for round_number in (1, 2):
        config = pending["cosine-1x-lr0.1"]
        ended_earlier(
            earlier, f"a_0000{round_number}", "cosine-1x-lr0.1", config, "completed", round_number
        )
    weights = ended_earlier(earlier, "a_00003", "cosine-1x-lr0.2", pending["cosine-1x-lr0.2"])
    (weights.parent / "state.pt").unlink()
    weights.parent.rmdir()
    weights.parent.parent.rmdir()  # its train folder, gone
    ended_earlier(earlier, "a_00004", "cosine-1x-lr0.05", pending["cosine-1x-lr0.05"])
    phase = Experiment(tmp_path / "transfer" / "round1")
    assert copy_ended_runs(phase, pending, donor(earlier)) == ["cosine-1x-lr0.05"]
    for launched, why in (
        ({"workers": 1}, "scored each on its seed's own held-out sample"),
        (
            {"workers": 2, "held_out": SHARED_HELD_OUT},
            r"trained on 2 worker\(s\), this transfer's on 1",
        ),
    ):
        (earlier / "launch.json").write_text(json.dumps(launched))
        with pytest.raises(ConfigError, match=why):
            donor(earlier)


def test_a_folder_that_is_no_transfer_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="expected the folder of an earlier transfer"):
        donor(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"--reuse .*empty: expected the folder"):
        donor(tmp_path / "empty")
