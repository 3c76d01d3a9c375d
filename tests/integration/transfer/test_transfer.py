"""A real (small) transfer on linreg through Ray: killed during export and mid-round, run
again, every run audited (the plan and the table alone: tests/unit/transfer/)."""

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from processes import frozen, kill_session
from sweeps import cli_in_process

from schedule_search.core import checkpoint as ckpt
from schedule_search.core.config import parse
from schedule_search.core.schedules import Warmup, Wsd
from schedule_search.recipe import load_recipe
from schedule_search.store.experiment import Experiment
from schedule_search.train.config import TrainConfig
from schedule_search.train.evaluation import Evaluation
from schedule_search.train.launch import run_local
from schedule_search.transfer.run import continuation, run_names, transfer_base
from schedule_search.transfer.scores import best_of_bank
from schedule_search.transfer.seeds import seed_of, seeded

#: A user's task module: linreg whose runs of seed 1 hold their first micro-batch while the file
#: `hold` names exists. A round starts its runs longest first: the first started is the
#: recipe's seed-1 replica (it trains from token 0; the recipe itself continues from the
#: sweep's horizon), which waits before its first evaluation for as long as the test needs
#: (the moment of the kill below, once another run has completed), at no CPU.
GATED_TASK = """
import os
import time

from schedule_search.tasks.linreg import build


class Gated:
    def __init__(self, task, hold):
        self.task, self.hold = task, hold

    def __getattr__(self, name):
        return getattr(self.task, name)

    def microbatch(self, index, rank, world_size):
        while os.path.exists(self.hold):
            time.sleep(0.05)
        return self.task.microbatch(index, rank, world_size)


def make(seed, hold, **options):
    task = build(options, seed=seed)
    return Gated(task, hold) if seed == 1 else task
"""


@pytest.mark.slow
@pytest.mark.cost(105)
@pytest.mark.timeout(600)
def test_small_transfer_on_linreg(tmp_path, monkeypatch, capfd):
    code = tmp_path / "code"
    code.mkdir()
    (code / "gated.py").write_text(GATED_TASK)
    monkeypatch.syspath_prepend(str(code))  # the straight reference run below builds it too
    # the CLI's driver imports it from there
    paths = [str(code), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, paths)))
    hold = tmp_path / "hold"
    space = {
        "name": "lt",
        "samples": 1,
        "base": {
            "task": {"name": "gated:make", "hold": str(hold), "dim": 64, "batch": 16},
            "optimizer": {"name": "sgd", "lr": 0.1},
            "schedule": {"kind": "poly", "alpha": 4.0, "warmup": 0.05, "gamma": 0.5},
            "ema": {"fractions": [0.0, 0.04], "objective": "best"},
            "window": {"policy": "microbatches", "microbatches": 2},
            "budget": {"horizon": 1.0, "eval_at": [0.5]},
        },
        "params": {"optimizer.lr": {"type": "loguniform", "low": 0.05, "high": 0.2}},
    }
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    storage = str(tmp_path / "runs")
    cli = [sys.executable, "-m", "schedule_search.cli"]
    # Run to their ends, the sweep and the transfer run in this process (`cli_in_process`).
    swept = cli_in_process(
        capfd, "sweep", str(tmp_path / "space.yaml"), "--workers", "1", "--storage", storage
    )
    assert swept.returncode == 0, swept.stderr[-3000:]
    sweep = Experiment(tmp_path / "runs" / "lt")

    # SIGKILL during export, at moments spread over its run: the recipe is never half written.
    recipe = sweep.root / "recipe.yaml"
    for delay in (1.5, 3.0):
        exporting = subprocess.Popen(
            [*cli, "export", "lt", "--storage", storage],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(delay)
        exporting.kill()
        exporting.wait()
        if recipe.exists():
            load_recipe(recipe)  # complete, or it would not load
    # export, and transfers refused before Ray starts (in `plan_launch`), run in this process:
    # they start no Ray and set nothing process-wide (the verbs' own process is
    # test_store_without_ray's). capfd holds all this process writes to its stderr meanwhile,
    # Python's and below.
    exported = cli_in_process(capfd, "export", "lt", "--storage", storage)
    assert exported.returncode == 0, exported.stderr[-3000:]
    uneven = cli_in_process(capfd, "transfer", "lt", "--workers", "3", "--storage", storage)
    assert uneven.returncode == 2 and len(uneven.stderr.strip().splitlines()) == 1
    assert "--workers 3: the recipe steps every 2 micro-batches" in uneven.stderr
    assert not (sweep.root / "transfer").exists()  # nothing launched
    # On another number of workers the window keeps the recipe's tokens per step.
    assert transfer_base(sweep, 2)[0].window.microbatches == 1
    # ... so the recipe continues from the sweep's checkpoint there too.
    trial_id = load_recipe(recipe).spec.source["trial_id"]
    on_one = continuation(sweep, trial_id, transfer_base(sweep, 1)[0], 1)
    assert on_one is not None
    assert continuation(sweep, trial_id, transfer_base(sweep, 2)[0], 2) == on_one

    # SIGKILL of the transfer's driver (and its Ray) once a run has finished and another has
    # started but not yet evaluated (its config written, no metrics: a replica held by the
    # gated task); run it again.
    # Linear-to-zero grids and schedule-free AdamW go through the same rounds (their plans and
    # the table are tested in test_transfer_plan, their runs in test_train); left out here to
    # keep this short.
    transfer = ["transfer", "lt", "--to", "2", "--concurrency", "2", "--storage", storage]
    transfer += ["--methods", "recipe,constant,cosine,wsd", "--seeds", "2"]
    first = Experiment(sweep.root / "transfer" / "round1")
    hold.touch()
    driver = subprocess.Popen(
        [*cli, *transfer],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300

    def states() -> dict[str, str]:
        if not first.root.exists():
            return {}
        return {row.trial_id: row.state for row in first.rows()}

    def the_moment(now: dict[str, str]) -> bool:
        return "completed" in now.values() and "pending" in now.values()

    while True:
        assert driver.poll() is None and time.monotonic() < deadline
        completed = "completed" in states().values()
        if completed:
            # A held replica stays pending; any other run this small is pending for a fraction
            # of a second, so the records are read with the whole session frozen: a run seen
            # pending cannot evaluate between the look and the kill (Ray's workers outlive a
            # killpg of the driver).
            with frozen(driver.pid):
                if the_moment(at_kill := states()):
                    kill_session(driver.pid)
                    break
        # No moment before a run has completed: until then a slower look leaves Ray its core.
        time.sleep(0.01 if completed else 0.05)
    driver.wait()
    hold.unlink()  # the replicas train on from here
    finished = {
        t: first.read_trial_json(t, "result.json")
        for t in first.trial_ids()
        if first.read_trial_json(t, "result.json")
    }
    never_evaluated = [t for t, state in at_kill.items() if state == "pending"]
    assert never_evaluated and not any(
        first.read_trial_json(t, "metrics.json") for t in never_evaluated
    )
    held = {t for name, t in run_names(first).items() if seed_of(name)[1] == 1}
    assert held & set(never_evaluated), (at_kill, held)  # the moment came from the gate
    done = cli_in_process(capfd, *transfer)
    assert done.returncode == 0, done.stderr[-3000:]
    for trial_id, result in finished.items():  # finished runs are kept, not redone
        assert first.read_trial_json(trial_id, "result.json") == result
    for trial_id in never_evaluated:  # killed before its first evaluation: run to its end
        assert first.read_trial_json(trial_id, "result.json")["state"] == "completed"
    root = sweep.root / "transfer"
    # A run that finished after Tune's last snapshot is started again under its id by the
    # restored grid: it reports its record (not moved aside, not rerun as an error).
    for phase in root.glob("round*"):
        assert not (phase / "trials" / ".orphaned").exists()
        assert {row.state for row in Experiment(phase).rows()} <= {"completed", "diverged"}, phase

    # Asking the finished transfer for other horizons or seeds is refused: it would change
    # its runs.
    methods = ["--methods", "recipe,constant,cosine,wsd"]
    for changed in (["--to", "4", "--seeds", "2"], ["--to", "2", "--seeds", "3"]):
        other = cli_in_process(capfd, "transfer", "lt", *changed, *methods, "--storage", storage)
        assert other.returncode == 2 and "Move that folder aside" in other.stderr, other.stderr
        assert len(other.stderr.strip().splitlines()) == 1
    for name in ("loss_vs_tokens.png", "gap_vs_horizon.png", "lr_curves.png"):
        assert (root / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = json.loads((root / "transfer.json").read_text())
    assert table["horizons"] == [1.0, 2.0]
    runs = check_every_run_is_audited(root, table)
    check_envelopes(table, runs)
    check_the_recipe_continued(sweep, root, table, runs)
    check_wsd_branches(runs, check_constant_grid(table, runs))
    check_seeds(table, runs)
    check_reused(capfd, root, transfer, table)


def check_reused(capfd, root: Path, transfer: list[str], table: dict) -> None:
    """The same transfer launched again with `--reuse` of this one (moved aside) plans the same
    runs under the same configs, branches off the same checkpoint files included: every run is
    copied, none trained (no round starts a Tune experiment), and the table is the same."""
    before = root.with_name("transfer.before")
    root.rename(before)
    again = cli_in_process(capfd, *transfer, "--reuse", str(before))
    assert again.returncode == 0, again.stderr[-3000:]
    assert not list(root.glob("round*/tune")), "a run was trained again"
    copied = read_runs(root)
    assert set(copied) == set(read_runs(before))
    for name, (phase, trial) in copied.items():
        events = (phase.trial_dir(trial) / "events.jsonl").read_text().splitlines()
        assert json.loads(events[-1])["event"] == "reused", name
    rows = json.loads((root / "transfer.json").read_text())["rows"]
    assert {label: row["loss"] for label, row in rows.items()} == {
        label: row["loss"] for label, row in table["rows"].items()
    }


def read_runs(root: Path) -> dict:
    """run name -> (its round's Experiment, trial id), over every round."""
    out = {}
    for folder in sorted(root.glob("round*")):
        phase = Experiment(folder)
        out.update({name: (phase, trial) for name, trial in run_names(phase).items()})
    return out


def check_every_run_is_audited(root: Path, table: dict) -> dict:
    """transfer.json holds every run's loss at every horizon it reached, as the run recorded
    it, with its LR, schedule and compute."""
    runs = read_runs(root)
    assert set(table["runs"]) == set(runs)
    for name, (phase, trial) in runs.items():
        entry = table["runs"][name]
        assert entry["where"] == f"{phase.root.name}/{trial}"
        history = phase.read_trial_json(trial, "metrics.json")
        # transfer.json is strict JSON: a loss that is not finite (diverged) is null there
        recorded = {
            f"{r['chinchilla']:g}": r["val_loss"] if math.isfinite(r["val_loss"]) else None
            for r in history
        }
        assert {h: v["objective"] for h, v in entry["losses"].items()} == recorded
        config = phase.read_trial_json(trial, "config.json")["config"]
        assert entry["lr"] == config["optimizer"]["lr"]
        assert entry["schedule"] == config["schedule"] and entry["compute"] > 0
    return runs


def check_envelopes(table: dict, runs: dict) -> None:
    """Each envelope is the best of its grid (seed 0's runs: replicas measure, not choose)."""
    runs = {name: where for name, where in runs.items() if seed_of(name)[1] == 0}
    for kind, label in (("cosine", "cosine"),):
        for h in ("1", "2"):
            finals = []
            for name, (phase, trial) in runs.items():
                if name.startswith(f"{kind}-{h}x-"):
                    last = phase.read_trial_json(trial, "metrics.json")[-1]
                    finals.append(last["val_loss_raw"])
            envelope = table["rows"][f"{label} envelope (last iterate)"]["loss"][h]
            assert envelope == min(finals) and len(finals) >= 3
            best = table["envelope_runs"][kind]["last"][h]
            lrs = sorted(
                float(n.rsplit("-lr", 1)[1]) for n in runs if n.startswith(f"{kind}-{h}x-")
            )
            best_lr = float(best["run"].rsplit("-lr", 1)[1])
            assert best["interior"] == (lrs[0] < best_lr < lrs[-1])
            if not best["interior"]:  # the bound was hit: two x2 steps beyond the start grid
                assert len(lrs) == 5


def check_the_recipe_continued(sweep: Experiment, root: Path, table: dict, runs: dict) -> None:
    """The recipe's run starts from the sweep trial's checkpoint at 1x (same config, same
    tokens per step) and ends where a run never stopped ends."""
    launched = json.loads((root / "launch.json").read_text())
    trial = launched["recipe_trial"]
    checkpoint = Path(launched["continued_from"])
    assert checkpoint.parent == sweep.train_run_dir(trial)
    state = ckpt.load_state(checkpoint)
    assert state["progress"]["status"] == "completed"  # the sweep trial's end, at 1x
    phase, trial_id = runs["recipe"]
    events = [json.loads(x) for x in (phase.trial_dir(trial_id) / "events.jsonl").open()]
    assert events[0] == {
        "event": "branched",
        "from": str(checkpoint),
        "tokens": state["window"]["tokens_seen"],
    }
    windows = [json.loads(x) for x in (phase.trial_dir(trial_id) / "windows.jsonl").open()]
    assert windows[0]["index"] == state["window"]["windows"]
    label = next(r for r in table["rows"] if r.startswith("recipe (continued from trial"))
    assert trial in label and table["rows"][label]["compute"] == 1.0
    config = phase.read_trial_json(trial_id, "config.json")["config"]
    straight = dict(config, branch_from=None)
    history = run_local(parse(TrainConfig, straight, "straight"), root.parent / "straight").history
    continued = phase.read_trial_json(trial_id, "metrics.json")
    assert continued[-1]["val_loss"] == history[-1]["val_loss"]  # bit for bit
    assert continued[-1]["tokens"] == history[-1]["tokens"]


def check_constant_grid(table: dict, runs: dict) -> str:
    """Constant + EMA's LR is its grid's best at 1x by the bank's best (every EMA member and
    the raw weights), and its run continues from that run's checkpoint at 1x; the grid's
    winner (returned) is seed 0's trunk up to there."""
    by_bank = {}
    for name, (phase, trial) in runs.items():
        if name.startswith("constant-lr"):
            last = phase.read_trial_json(trial, "metrics.json")[-1]
            assert last["chinchilla"] == 1.0
            by_bank[name] = best_of_bank(Evaluation.from_metrics(last))[0]
    assert len(by_bank) >= 3
    winner = min(by_bank, key=by_bank.get)
    phase, trial = runs["constant"]
    start = Path(phase.read_trial_json(trial, "config.json")["config"]["branch_from"])
    winner_phase, winner_trial = runs[winner]
    assert start.parent == winner_phase.train_run_dir(winner_trial)
    assert ckpt.load_state(start)["progress"]["status"] == "completed"  # its end, at 1x
    row = table["rows"]["constant + EMA (best of bank)"]
    assert row["loss"]["1"] == by_bank[winner]
    return winner


def check_wsd_branches(runs: dict, winner: str) -> None:
    """Each seed's branches start from its own trunk's checkpoint: seed 0's from the constant
    grid's `winner` up to 1x, and from its continuation after."""
    for run in [n for n in runs if n.startswith("wsd")]:
        branch_phase, trial_id = runs[run]
        config = parse(
            TrainConfig, branch_phase.read_trial_json(trial_id, "config.json")["config"], run
        )
        h = config.schedule.horizon
        share = config.schedule.decay_fraction
        seed = seed_of(run)[1]
        trunk = winner if seed == 0 and (1 - share) * h <= 1.0 else seeded("constant", seed)
        phase, constant = runs[trunk]
        checkpoints = ckpt.checkpoint_folders(phase.train_run_dir(constant))
        assert (share, config.schedule.cooldown) in ((0.1, "linear"), (0.2, "sqrt"))
        branch_tokens = (1 - share) * h * 20 * 64
        expected = min(
            c for c in checkpoints if int(c.name.removeprefix("checkpoint_")) >= branch_tokens
        )
        assert config.branch_from == str(expected)
        trunk = ckpt.load_state(expected)
        # The branch's LR is its WSD formula at the token clock, window by window.
        schedule = Wsd(
            Warmup(0.05 * 80), h * 80, share, config.schedule.floor, config.schedule.cooldown
        )
        tokens = trunk["window"]["tokens_seen"]
        windows = [
            json.loads(x) for x in (branch_phase.trial_dir(trial_id) / "windows.jsonl").open()
        ]
        assert windows and windows[0]["index"] == trunk["window"]["windows"]
        for record in windows:
            assert record["lr"] == pytest.approx(
                config.optimizer.lr * schedule(tokens / 16), rel=1e-12
            )
            tokens += record["tokens"]
        decaying = [w["lr"] for w in windows if w["lr"] < config.optimizer.lr]
        assert decaying and decaying == sorted(decaying, reverse=True)


def check_seeds(table: dict, runs: dict) -> None:
    """`--seeds 2`: every row's run again with seed 1 (the grids once, the best LR's replica
    at each horizon), from token 0; each cell of the table over seeds holds both seeds' losses
    as the runs recorded them, and the gap to the envelope paired by seed."""
    assert table["seeds"] == 2
    replicas = {name: where for name, where in runs.items() if seed_of(name)[1] == 1}
    best = {h: table["envelope_runs"]["cosine"]["last"][h]["run"] for h in ("1", "2")}
    wsd = {f"{prefix}-{h}x" for prefix in ("wsd", "wsd-sqrt") for h in ("1", "2")}
    assert {seed_of(n)[0] for n in replicas} == {"recipe", "constant", *best.values(), *wsd}
    for name, (phase, trial) in replicas.items():
        config = phase.read_trial_json(trial, "config.json")["config"]
        assert config["seed"] == 1
        if not name.startswith("wsd"):
            assert config["branch_from"] is None
    phase, trial = runs[seeded("recipe", 1)]
    recorded = phase.read_trial_json(trial, "metrics.json")
    label = next(r for r in table["rows"] if r.startswith("recipe (continued from trial"))
    envelope = table["rows"]["envelope (best of both, last iterate)"]["seeds"]
    for h in ("1", "2"):
        cell = table["rows"][label]["seeds"][h]
        seed1 = next(r for r in recorded if f"{r['chinchilla']:g}" == h)
        assert cell["n"] == 2 and cell["losses"][1] == seed1["val_loss"]
        assert cell["losses"][0] == table["rows"][label]["loss"][h]
        gaps = [a - b for a, b in zip(cell["losses"], envelope[h]["losses"], strict=True)]
        assert cell["gap"] == pytest.approx(sum(gaps) / 2)
        assert cell["verdict"] in ("better", "worse", "within noise")
