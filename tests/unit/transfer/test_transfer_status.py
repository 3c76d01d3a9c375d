"""`status` on a sweep with a transfer: every run started so far, round by round, and whether
a driver is at work on it (the experiment's lock, as the kernel holds it), from the records
alone. A run of a stopped transfer that had not ended reads `unfinished`, not `running`."""

import json

import pytest

from schedule_search.cli import main
from schedule_search.store.experiment import Experiment, SweepSettings
from schedule_search.store.facts import SweepFacts, write_facts
from schedule_search.store.lock import experiment_lock
from schedule_search.train.evaluation import Evaluation


def _evaluated(horizon: float, loss: float) -> dict:
    return Evaluation(
        tokens=int(horizon * 1000), chinchilla=horizon, val_loss=loss, milestone=1, losses={}
    ).to_metrics()


def write_transfer(storage, runs: dict[str, tuple[float, list[tuple[float, float]], bool]]):
    """A sweep `tl` with a transfer to 2x over 2 seeds whose round 1 started `runs`: name ->
    (horizon it trains to, its evaluations (horizon, loss), whether it ended)."""
    sweep = Experiment(storage / "tl")
    sweep.root.mkdir(parents=True)
    sweep.save_settings(SweepSettings(name="tl", samples=1, workers=1, concurrency=1))
    write_facts(sweep.root, SweepFacts(1.0, [1.0], 20.0, 100, 16.0))
    (sweep.root / "transfer").mkdir()
    launched = {"horizons": [1.0, 2.0], "to": [2.0], "seeds": 2}
    (sweep.root / "transfer" / "launch.json").write_text(json.dumps(launched))
    phase = Experiment(sweep.root / "transfer" / "round1")
    for number, (name, (horizon, evaluations, ended)) in enumerate(runs.items()):
        trial = f"r{number}"
        config = {"budget": {"horizon": horizon}}
        phase.write_trial_json(trial, "config.json", {"params": {"run": name}, "config": config})
        if evaluations:
            phase.write_trial_json(trial, "metrics.json", [_evaluated(*e) for e in evaluations])
        if ended:
            result = {"state": "completed", "reason": "", "val_loss": evaluations[-1][1]}
            phase.write_trial_json(trial, "result.json", result)
    return sweep


def status_lines(storage, capsys) -> list[str]:
    assert main(["status", "tl", "--storage", str(storage)]) == 0
    return capsys.readouterr().out.splitlines()


def row_of(lines: list[str], run: str) -> list[str]:
    return next(line for line in lines if f" {run} " in line).replace("│", " ").split()


def test_status_shows_a_transfer_running_stopped_and_done(tmp_path, capsys):
    storage = tmp_path / "runs"
    runs = {
        "constant": (2.0, [(1.0, 1.5), (2.0, 1.25)], True),
        "constant@seed1": (2.0, [(1.0, 1.6)], False),
        "recipe@seed1": (2.0, [], False),
    }
    sweep = write_transfer(storage, runs)

    lines = status_lines(storage, capsys)
    summary = next(line for line in lines if line.startswith("transfer to 2x, 2 seeds: "))
    assert summary.startswith(
        "transfer to 2x, 2 seeds: stopped; 3 runs started in 1 round (1 completed, 2 unfinished)"
    ), summary
    assert f"transfer tl --storage {storage}` resumes it" in summary, summary
    assert row_of(lines, "constant") == ["1", "constant", "completed", "2x", "2x", "1.2500"]
    seed1 = ["1", "constant@seed1", "unfinished", "1x", "2x", "1.6000"]
    assert row_of(lines, "constant@seed1") == seed1
    assert row_of(lines, "recipe@seed1") == ["1", "recipe@seed1", "unfinished", "-", "2x", "-"]

    with experiment_lock(sweep.root, "transfer"):
        lines = status_lines(storage, capsys)
    summary = next(line for line in lines if line.startswith("transfer to"))
    assert ": running (`transfer` by pid " in summary, summary
    assert "(1 completed, 1 pending, 1 running)" in summary, summary
    assert row_of(lines, "constant@seed1")[2] == "running"
    assert row_of(lines, "recipe@seed1")[2] == "pending"

    # A table written by an earlier transfer does not make one with runs unfinished done;
    # while the sweep's own resume holds the experiment, the transfer waits for it.
    (sweep.root / "transfer" / "transfer.md").write_text("# Transfer\n")
    with experiment_lock(sweep.root, "resume"):
        lines = status_lines(storage, capsys)
    summary = next(line for line in lines if line.startswith("transfer to"))
    assert ": stopped; " in summary and "resumes it once `resume` by pid " in summary, summary

    runs = {name: (2.0, [(1.0, 1.5), (2.0, 1.2)], True) for name in runs}
    write_transfer(tmp_path / "done", runs)
    (tmp_path / "done" / "tl" / "transfer" / "transfer.md").write_text("# Transfer\n")
    summary = next(
        line for line in status_lines(tmp_path / "done", capsys) if "transfer to" in line
    )
    assert ": done; 3 runs started in 1 round (3 completed); table in " in summary, summary


@pytest.mark.parametrize("launched", ["{not json", "[]", '{"to": null}'])
def test_an_unreadable_transfer_leaves_the_sweeps_table_and_says_so(tmp_path, capsys, launched):
    storage = tmp_path / "runs"
    sweep = write_transfer(storage, {"constant": (2.0, [(1.0, 1.5)], False)})
    (sweep.root / "transfer" / "launch.json").write_text(launched)
    assert main(["status", "tl", "--storage", str(storage)]) == 0
    out, err = capsys.readouterr()
    assert "tl: 0 trials" in out
    assert (
        err.startswith(f"transfer: {sweep.root / 'transfer'}: unreadable (")
        and err.count("\n") == 1
    )


def test_damaged_run_records_are_shown_as_corrupt_and_status_goes_on(tmp_path, capsys):
    storage = tmp_path / "runs"
    runs = {"constant": (2.0, [(1.0, 1.5)], False), "recipe": (2.0, [(1.0, 1.4)], False)}
    sweep = write_transfer(storage, runs)
    (sweep.root / "transfer" / "round1" / "trials" / "r1" / "config.json").write_text("[1, 2]")
    (sweep.root / "transfer" / "round1.bak").mkdir()  # not a round: left out
    lines = status_lines(storage, capsys)
    assert row_of(lines, "r1") == ["1", "r1", "corrupt", "-", "-", "-"]
    assert row_of(lines, "constant")[:3] == ["1", "constant", "unfinished"]
    assert sum(" constant " in line for line in lines) == 1
