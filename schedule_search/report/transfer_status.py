"""What `status` shows of a sweep's transfer: every run started so far, how far it trained and
its loss there, and whether a driver is at work on it now. A transfer study is hours of
training (the tinylm one about 500x Chinchilla); its driver's live view is gone once its
terminal is, and these records are what remains. Read from the files alone: no Ray."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from schedule_search.core.states import State
from schedule_search.store.experiment import Experiment, TrialRow
from schedule_search.store.lock import lock_holder

__all__ = ["TransferRun", "transfer_runs", "transfer_status"]


@dataclass(frozen=True)
class TransferRun:
    """One run of a transfer: its name in the study (`cosine-8x-lr0.0079@seed2`), its round,
    the horizon it trains to, and its row (state, horizon reached, loss there)."""

    name: str
    round: int
    horizon: float
    row: TrialRow


def transfer_runs(root: Path) -> list[TransferRun]:
    """The runs of the transfer of the sweep at `root` that have started, round by round."""
    runs = []
    for folder in sorted((root / "transfer").glob("round*"), key=_round_number):
        phase = Experiment(folder)
        for row in phase.rows():
            config = phase.read_trial_json(row.trial_id, "config.json") or {}
            name = config.get("params", {}).get("run", row.trial_id)
            horizon = config.get("config", {}).get("budget", {}).get("horizon", float("nan"))
            runs.append(TransferRun(name, _round_number(folder), horizon, row))
    return runs


def transfer_status(root: Path, again: str) -> tuple[str, Table]:
    """One line (the study launched; running, stopped or done; the runs so far) and a table
    of the runs started, for the transfer of the sweep at `root`. `again` is the command that
    resumes it."""
    runs = transfer_runs(root)
    holder = lock_holder(root)
    running = holder is not None and holder.startswith("`transfer`")
    return _summary(root, runs, holder if running else None, again), _table(runs, running)


def _summary(root: Path, runs: list[TransferRun], holder: str | None, again: str) -> str:
    launched = json.loads((root / "transfer" / "launch.json").read_text())
    to = ", ".join(f"{h:g}x" for h in launched.get("to", []))
    study = f"transfer to {to}, {_count(launched.get('seeds', 1), 'seed')}"
    counts: dict[str, int] = {}
    for run in runs:
        counts[run.row.state] = counts.get(run.row.state, 0) + 1
    ended = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    rounds = _count(max((run.round for run in runs), default=0), "round")
    so_far = f"{_count(len(runs), 'run')} started in {rounds} ({ended or 'none yet'})"
    if holder is not None:
        return f"{study}: running ({holder}); {so_far}"
    unfinished = [r for r in runs if r.row.state in (State.RUNNING, State.PENDING)]
    if unfinished or not (root / "transfer" / "transfer.md").exists():
        return f"{study}: stopped; {so_far}; `{again}` resumes it"
    return f"{study}: done; {so_far}; table in {root / 'transfer' / 'transfer.md'}"


def _table(runs: list[TransferRun], running: bool) -> Table:
    """A row per run started: those of a stopped transfer that had not ended read
    `unfinished`, not `running`."""
    table = Table(title="transfer runs")
    for column in ("round", "run", "state", "reached", "of", "val_loss"):
        table.add_column(column)
    for run in runs:
        state: str = run.row.state
        if not running and state in (State.RUNNING, State.PENDING):
            state = "unfinished"
        reached = f"{run.row.chinchilla:g}x" if run.row.chinchilla else "-"
        loss = f"{run.row.val_loss:.4f}" if run.row.chinchilla else "-"
        table.add_row(str(run.round), run.name, state, reached, f"{run.horizon:g}x", loss)
    return table


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _round_number(folder: Path) -> int:
    digits = folder.name.removeprefix("round")
    return int(digits) if digits.isdigit() else 0
