"""What `status` shows of a sweep's transfer: every run started so far, how far it trained and
its loss there, and whether a driver is at work on it now. A transfer study is hours of
training (the tinylm one about 500x Chinchilla); its driver's live view is gone once its
terminal is, and these records are what remains. Read from the files alone: no Ray."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from schedule_search.core.config import parse
from schedule_search.core.states import State
from schedule_search.store.experiment import Experiment, TrialRow
from schedule_search.store.lock import lock_holder
from schedule_search.store.records import read_records
from schedule_search.train.config import TrainConfig

__all__ = ["TransferRun", "transfer_runs", "transfer_status"]

#: What a run that had not ended reads once no transfer is at work on it.
UNFINISHED = "unfinished"


@dataclass(frozen=True)
class TransferRun:
    """One run of a transfer: its name in the study (`cosine-8x-lr0.0079@seed2`), its round,
    the horizon it trains to (NaN where its records are damaged), and its row (state,
    horizon reached, loss there)."""

    name: str
    round_number: int
    horizon: float
    row: TrialRow


def transfer_runs(root: Path) -> list[TransferRun]:
    """The runs of the transfer of the sweep at `root` that have started, round by round."""
    runs = []
    rounds = {
        k: f for f in (root / "transfer").glob("round*") if (k := _round_number(f)) is not None
    }
    for number, folder in sorted(rounds.items()):
        phase = Experiment(folder)
        for row in phase.rows():
            name, horizon = row.trial_id, math.nan
            if row.state != State.CORRUPT:  # its records are checked: a training config
                records = read_records(phase.trial_dir(row.trial_id))
                name = str(records.params.get("run", row.trial_id))
                horizon = parse(TrainConfig, records.config["config"], name).budget.horizon
            runs.append(TransferRun(name, number, horizon, row))
    return runs


def transfer_status(root: Path, again: str) -> tuple[str, Table]:
    """One line (the study launched; running, stopped or done; the runs so far) and a table
    of the runs started, for the transfer of the sweep at `root`. `again` is the command that
    resumes it. A damaged launch record is a ValueError naming it."""
    launched = _launch_record(root / "transfer" / "launch.json")
    runs = transfer_runs(root)
    holder = lock_holder(root)
    running = holder is not None and holder.startswith("`transfer`")
    states = [_shown_state(run.row.state, running) for run in runs]
    to = ", ".join(f"{h:g}x" for h in launched["to"])
    study = f"transfer to {to}, {_count(launched.get('seeds', 1), 'seed')}"
    by_state = ", ".join(f"{states.count(s)} {s}" for s in sorted(set(states)))
    rounds = _count(max((run.round_number for run in runs), default=0), "round")
    so_far = f"{_count(len(runs), 'run')} started in {rounds} ({by_state or 'none yet'})"
    if running:
        summary = f"{study}: running ({holder}); {so_far}"
    elif UNFINISHED in states or not (root / "transfer" / "transfer.md").exists():
        after = f" once {holder} ends" if holder is not None else ""
        summary = f"{study}: stopped; {so_far}; `{again}` resumes it{after}"
    else:
        summary = f"{study}: done; {so_far}; table in {root / 'transfer' / 'transfer.md'}"
    return summary, _table(runs, states)


def _launch_record(path: Path) -> dict:
    launched = json.loads(path.read_text())
    to = launched.get("to") if isinstance(launched, dict) else None
    if not isinstance(to, list) or not all(isinstance(h, int | float) for h in to):
        raise ValueError(f"{path}: not a transfer's launch record (no list of horizons `to`)")
    return launched


def _shown_state(state: State, running: bool) -> str:
    """A run of a stopped transfer that had not ended is `unfinished`, not `running`."""
    return UNFINISHED if not running and state in (State.RUNNING, State.PENDING) else state


def _table(runs: list[TransferRun], states: list[str]) -> Table:
    table = Table(title="transfer runs")
    for column in ("round", "run", "state", "reached", "of", "val_loss"):
        table.add_column(column)
    for run, state in zip(runs, states, strict=True):
        reached = f"{run.row.chinchilla:g}x" if run.row.chinchilla else "-"
        loss = f"{run.row.val_loss:.4f}" if run.row.chinchilla else "-"
        of = f"{run.horizon:g}x" if math.isfinite(run.horizon) else "-"
        table.add_row(str(run.round_number), run.name, state, reached, of, loss)
    return table


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _round_number(folder: Path) -> int | None:
    """k of a round's folder `round<k>`; None for anything else lying there."""
    digits = folder.name.removeprefix("round")
    return int(digits) if digits.isdigit() else None
