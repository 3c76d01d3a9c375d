"""The sweep end to end on a real local Ray: Tune + Optuna + ASHA over 2-worker Ray Train
trials, export and the recipe, and a real SIGKILL of the sweep's driver followed by resume."""

import json
import pickle
import re
from pathlib import Path

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from sweeps import (
    FRACTIONS,
    SHARES_THE_FINISHED_SWEEP,
    SPACE,
    cli_in_process,
    kill_at,
    start_and_kill,
    trial_records,
    write_space,
)

from schedule_search.recipe import load_recipe
from schedule_search.store.experiment import Experiment

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@SHARES_THE_FINISHED_SWEEP
def test_linreg_sweep_killed_before_its_first_trial_then_export_and_recipe(
    finished_sweep, tmp_path, capsys
):
    done = finished_sweep.resumed
    assert done.returncode == 0, done.stderr[-3000:]
    storage, experiment = finished_sweep.copy_to(tmp_path)
    # The live view: a status line after every event, ending with every trial ended.
    status = [line for line in done.stdout.splitlines() if line.startswith("[")]
    assert status and all("| best " in line and "ETA" in line for line in status[1:]), status
    assert "0 running" in status[-1] and "0 waiting" in status[-1], status[-1]
    rows = experiment.rows()
    assert len(rows) == SPACE["samples"]
    assert all(r.state in ("completed", "stopped") for r in rows), [
        (r.state, r.reason) for r in rows
    ]
    assert any(r.state == "completed" for r in rows)
    assert any(r.state == "stopped" for r in rows), "ASHA must stop a trial for this test"
    # Trials of two workers on two CPUs, one at a time: one that started after a stopped one
    # ended had that trial's CPUs back, although another local Ray ran beside the sweep.
    started = {
        r.trial_id: (experiment.trial_dir(r.trial_id) / "config.json").stat().st_mtime for r in rows
    }
    stopped = [
        (experiment.trial_dir(r.trial_id) / "result.json").stat().st_mtime
        for r in rows
        if r.state == "stopped"
    ]
    assert any(t > min(stopped) for t in started.values()), "no trial started after a stopped one"
    assert (experiment.root / "trials.csv").is_file() and (experiment.root / "space.yaml").is_file()
    study = optuna.load_study(
        study_name="lin",
        storage=JournalStorage(JournalFileBackend(str(experiment.root / "optuna.journal"))),
    )
    check_journal(experiment, study, rows)
    check_dashboard_reads(experiment.root / "optuna.journal", study)
    check_live_searcher_agrees(experiment, study)

    # export, status and report start no Ray: run in this process (their own process is
    # test_store_without_ray's).
    best_yaml = str(tmp_path / "best.yaml")
    exported = cli_in_process(capsys, "export", "lin", "--storage", str(storage), "-o", best_yaml)
    assert exported.returncode == 0, exported.stderr
    recipe = load_recipe(tmp_path / "best.yaml")
    best = experiment.best(4.0)
    assert (
        recipe.spec.source["trial_id"] == best.trial_id == study.best_trial.user_attrs["trial_id"]
    )
    assert recipe.spec.objective["value"] == best.val_loss == study.best_value
    # The best (config, fraction) pair: the fraction whose loss at the horizon was lowest.
    final = experiment.read_trial_json(best.trial_id, "metrics.json")[-1]
    losses = {f: final["val_loss_raw" if f == 0 else f"val_loss_ema/{f:g}"] for f in FRACTIONS}
    assert recipe.ema_fraction == min(losses, key=losses.get)
    assert best.val_loss == min(losses.values())
    config = experiment.read_trial_json(best.trial_id, "config.json")
    assert recipe.peak_lr == config["params"]["optimizer.lr"]
    assert recipe.spec.schedule.alpha == config["params"]["schedule.alpha"]
    status = cli_in_process(capsys, "status", "lin", "--storage", str(storage))
    best_line = next(line for line in status.stdout.splitlines() if f"{best.trial_id} *" in line)
    assert f"{recipe.ema_fraction:g}" in best_line or "raw" in best_line

    # The recipe's LR multipliers are exactly those the trial trained with, window by window.
    windows = [
        json.loads(x) for x in (experiment.trial_dir(best.trial_id) / "windows.jsonl").open()
    ]
    tokens = 0
    for record in windows:
        assert record["lr"] == recipe.peak_lr * recipe.lr_multiplier(recipe.clock(tokens))
        tokens += record["tokens"]
    assert len(windows) > 50

    reported = cli_in_process(capsys, "report", "lin", "--storage", str(storage))
    assert reported.returncode == 0, reported.stderr[-3000:]
    check_report(experiment, best.trial_id, windows)


def check_journal(experiment: Experiment, study: optuna.Study, rows: list) -> None:
    """Optuna's multi-fidelity terms: every evaluation an intermediate value at its milestone,
    stopped trials PRUNED, completed ones COMPLETE at the horizon with the best of the bank;
    every fraction's loss reaches the study."""
    from optuna.trial import TrialState

    assert len(study.trials) == len(rows)
    by_id = {t.user_attrs["trial_id"]: t for t in study.trials}
    assert set(by_id) == {r.trial_id for r in rows}
    for row in rows:
        trial = by_id[row.trial_id]
        history = experiment.read_trial_json(row.trial_id, "metrics.json")
        if row.state == "stopped":  # what it trained after the STOP arrived is not its result
            stop = experiment.read_trial_json(row.trial_id, "result.json")["milestone"]
            counted = [h for h in history if h["milestone"] <= stop]
            # Its record says exactly what happened: status shows it in the reason.
            past = len(counted) < len(history)
            assert ("trained on to" in row.reason) == past, (row.reason, history, stop)
            history = counted
            assert row.chinchilla == history[-1]["chinchilla"] < 4.0
            assert trial.value == history[-1]["val_loss"]  # as Optuna tells a pruned trial
        assert trial.intermediate_values == {h["milestone"]: h["val_loss"] for h in history}
        expected = TrialState.PRUNED if row.state == "stopped" else TrialState.COMPLETE
        assert trial.state == expected, (row.trial_id, row.state, trial.state)
        final = history[-1]
        losses = {f: final["val_loss_raw" if f == 0 else f"val_loss_ema/{f:g}"] for f in FRACTIONS}
        assert trial.user_attrs["ema_fraction"] == min(losses, key=losses.get)
        assert final["val_loss"] == min(losses.values())
        bank = trial.user_attrs["bank"]
        assert sorted(bank.values()) == sorted(losses.values()) and len(bank) == len(FRACTIONS)
        if expected == TrialState.COMPLETE:
            assert trial.value == final["val_loss"] and final["chinchilla"] == 4.0


def check_dashboard_reads(journal: Path, study: optuna.Study) -> None:
    """optuna-dashboard (its own web app, called through WSGI) reads the journal and has every
    trial's learning curve."""
    from wsgiref.util import setup_testing_defaults

    from optuna_dashboard import wsgi

    app = wsgi(JournalStorage(JournalFileBackend(str(journal))))

    def get(path: str) -> dict:
        environ = {"PATH_INFO": path}
        setup_testing_defaults(environ)
        status = []
        body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
        assert status == ["200 OK"], (path, status)
        return json.loads(body)

    (summary,) = get("/api/studies")["study_summaries"]
    shown = get(f"/api/studies/{summary['study_id']}")
    assert shown["has_intermediate_values"]
    curves = {
        json.dumps(
            {p["name"]: float(p["param_external_value"]) for p in t["params"]}, sort_keys=True
        ): {v["step"]: v["value"] for v in t["intermediate_values"]}
        for t in shown["trials"]
    }
    assert curves == {
        json.dumps(t.params, sort_keys=True): t.intermediate_values for t in study.trials
    }


def check_live_searcher_agrees(experiment: Experiment, journal: optuna.Study) -> None:
    """The searcher Tune saved was told what the journal records: the same states, values
    and intermediate values for the same configs."""
    states = sorted(experiment.tune_dir.glob("searcher-state-*.pkl"))
    with open(states[-1], "rb") as handle:
        live = pickle.load(handle)["_ot_study"]

    def told(study: optuna.Study) -> dict:
        return {
            json.dumps(t.params, sort_keys=True): (t.state, t.value, t.intermediate_values)
            for t in study.trials
        }

    assert told(live) == told(journal)


PNG = b"\x89PNG\r\n\x1a\n"


def check_report(experiment: Experiment, best: str, best_windows: list[dict]) -> None:
    report = experiment.root / "report"
    text = (report / "report.md").read_text()
    assert best in text.split("## Best trials", 1)[1].split("##", 1)[0]
    for name in (
        "loss_vs_tokens.png",
        "lr_ema.png",
        "windows.png",
        "importance.png",
        "parallel_coords.png",
    ):
        data = (report / name).read_bytes()
        assert data[:8] == PNG and len(data) > 5000, name
        assert f"]({name})" in text, name
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert width > 300 and height > 200, (name, width, height)
    # TensorBoard: one folder per trial; the best trial's window losses read back exactly.
    folders = sorted(p.name for p in (report / "tensorboard").iterdir())
    assert folders == sorted(experiment.trial_ids())
    scalars = read_event_scalars(report / "tensorboard" / best)
    assert [v for _, v in scalars["window/loss"]] == pytest.approx(
        [w["loss"] for w in best_windows], rel=1e-6
    )
    history = experiment.read_trial_json(best, "metrics.json")
    assert [step for step, _ in scalars["eval/val_loss"]] == [h["tokens"] for h in history]


def read_event_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """TensorBoard's record framing (length, CRC, event proto, CRC), read without TensorBoard."""
    from tensorboardX.proto import event_pb2

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            length = int.from_bytes(data[offset : offset + 8], "little")
            event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def searcher_history(experiment: Experiment) -> int:
    """How many trials the restored Optuna study holds (from Tune's saved searcher state)."""
    states = sorted(experiment.tune_dir.glob("searcher-state-*.pkl"))
    assert states, "Tune saved no searcher state"
    with open(states[-1], "rb") as handle:
        state = pickle.load(handle)
    return len(state["_ot_study"].trials)


@pytest.mark.cost(55)
def test_sigkill_of_the_driver_after_a_trial_then_mid_trial_then_resume(tmp_path, capfd):
    """Killed after a trial finished (none running), resumed, killed again in the middle of a
    trial with Tune's snapshots made rare, resumed to the end: every trial kept, none run
    twice, the interrupted trial resumed from its checkpoint. The search is the loss/time
    multi-objective one, which keeps its Pareto bookkeeping through both kills."""
    samples = 3
    space = write_space(
        tmp_path,
        samples=samples,
        base={**SPACE["base"], "task": {"name": "linreg", "dim": 256, "batch": 16}},
        objectives=["val_loss", "wall_s"],
    )
    storage = tmp_path / "runs"
    experiment = Experiment(storage / "lin")
    # One trial at a time, each trained in its Tune trial's process (one CPU worker): the
    # Ray Train path of these kills is `test_reliability`'s driver kill on 2 workers.
    start_and_kill(space, storage, "after_a_trial_finished", "--workers", "1", "--concurrency", "1")
    kept = {t: r for t, r in trial_records(experiment).items() if r["result"]}
    assert kept
    # Mid-trial, Tune's periodic snapshot is made rare (every 1000 s; Tune still forces some),
    # which widens the hole between what happened and what Tune saved.
    resume = ["resume", "lin", "--storage", str(storage)]
    stale = {"TUNE_GLOBAL_CHECKPOINT_S": "1000"}
    interrupted = kill_at(resume, storage, "in_the_middle_of_a_trial", stale)
    before = trial_records(experiment)
    kept |= {t: r for t, r in before.items() if r["result"]}
    tokens_at_kill = before[interrupted]["metrics"][-2]["tokens"]  # surely checkpointed

    resumed = cli_in_process(capfd, *resume)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = trial_records(experiment)
    ended = {t: r for t, r in after.items() if r["result"]}
    assert len(after) == samples and len(ended) == samples, {
        t: r["result"] for t, r in after.items()
    }
    configs = [json.dumps(r["params"], sort_keys=True) for r in after.values()]
    assert len(set(configs)) == samples, "no config may run twice"
    for trial_id, record in kept.items():  # finished work is kept as it was
        assert after[trial_id]["result"]["state"] == record["result"]["state"]
    # The same trial, or (had Tune forgotten it) the trial its config came back as.
    adopter = next(t for t, r in after.items() if r["params"] == before[interrupted]["params"])
    events = (experiment.trial_dir(adopter) / "events.jsonl").read_text().splitlines()
    resumes = [json.loads(e) for e in events if json.loads(e)["event"] == "resumed"]
    assert resumes and resumes[0]["tokens"] >= tokens_at_kill > 0, (resumes, tokens_at_kill)
    assert searcher_history(experiment) == samples
    # The resumed driver's live view counts the trials that ended before each kill.
    last = [line for line in resumed.stdout.splitlines() if line.startswith("[")][-1]
    counts = dict((state, int(n)) for n, state in re.findall(r"(\d+) (\w+)", last.split("|")[0]))
    assert counts["running"] == counts["waiting"] == 0 and sum(counts.values()) == samples, last
