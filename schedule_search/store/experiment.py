"""The experiment folder `runs/<name>/` and the durable per-trial records in it.

    runs/<name>/
      space.yaml         the search space, as given
      facts.json         what the space resolved to at launch (horizon, model size; `facts`)
      sweep.json         how the sweep was launched (what `resume` needs)
      tune/              Ray Tune's own experiment state
      train/             training runs: one per trial config, holding its checkpoints
      trials/<id>/       config.json, metrics.json (every evaluation), windows.jsonl,
                         result.json (written by the sweep driver when the trial ends)
      trials.csv/.json   one row per trial: config, state, milestone, best loss
      recipe.yaml        the exported best config (`export`)
      driver.jsonl       when each launch of the sweep's driver started and ended

Everything here is read without Ray, so `status` and `export` work while a sweep runs or
after it died.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from schedule_search.core.averaging import loss_key
from schedule_search.core.config import ConfigError
from schedule_search.core.files import append_jsonl, atomic_write_text, read_jsonl, strict_json
from schedule_search.core.states import State
from schedule_search.store.records import read_records

__all__ = [
    "FAMILY",
    "FORMAT",
    "RUNS",
    "Experiment",
    "SweepSettings",
    "TrialRow",
    "select_best",
    "train_run_name",
]

RUNS = Path("runs")
#: The layout of an experiment folder this version reads and writes (in sweep.json). A folder
#: of another format is refused in one line: no version reads another's folders.
FORMAT = 1


@dataclass
class SweepSettings:
    """How a sweep was launched; saved in sweep.json so `resume` launches it the same way."""

    name: str
    samples: int
    workers: int
    concurrency: int
    gpus_per_worker: float = 0.0
    cpus_per_worker: float = 1.0
    address: str | None = None
    max_failures: int = 2

    @property
    def in_process(self) -> bool:
        """Whether a trial trains in its Tune trial's own process instead of a Ray Train
        worker group: one CPU worker on a local Ray has no peer to synchronize with, and a
        worker group would add three processes a trial (controller, placement-group cleaner,
        worker), each importing torch, about 10 s of CPU on a small machine for nothing it
        needs. On a cluster the trial keeps its worker group: its `trial_slot` may sit on a
        node (the head) whose CPUs are not the ones meant for training.

        An in-process trial also hands its process to the next trial (Tune's `reuse_actors`,
        in a sweep and a transfer), which then skips importing torch and the trainer: a 6-trial
        linreg sweep took 19.6 s of CPU instead of 33.9 s, the 22 runs of a small linreg
        transfer 48 s instead of 109 s (bit-identical losses). A worker-group trial does not:
        reused after ASHA stopped it, its process kept the stopped run's workers and the next
        trial waited for them forever."""
        return self.workers == 1 and self.gpus_per_worker == 0 and self.address is None


#: The param that names a trial's family in a space with families (`sweep.space`).
FAMILY = "family"


@dataclass
class TrialRow:
    trial_id: str
    state: State
    params: dict[str, Any] = field(default_factory=dict)
    chinchilla: float = 0.0
    tokens: int = 0
    val_loss: float = math.nan
    best_val_loss: float = math.nan
    wall_s: float = 0.0
    trial_s: float = math.nan
    reason: str = ""
    #: The EMA fraction `val_loss` came from (0 = raw weights); NaN before an evaluation.
    ema_fraction: float = math.nan
    #: (milestone index, Chinchilla multiple, objective) of every evaluation, in order.
    curve: list[tuple[int, float, float]] = field(default_factory=list)
    #: The last evaluation's loss of every member of the EMA bank, by metric name.
    bank: dict[str, float] = field(default_factory=dict)
    #: How many times the trial's run went on from a checkpoint after its workers were lost
    #: (a worker, a node, the driver): the `resumed` events of its `events.jsonl`.
    restarts: int = 0

    @property
    def family(self) -> str | None:
        """The family the trial searched in (None in a space without families)."""
        family = self.params.get(FAMILY)
        return None if family is None else str(family)


def _restarts(events: Path) -> int:
    """The `resumed` lines of a run's event log (a line cut short by a kill is skipped; an
    unreadable log, as a record the table cannot read, counts none rather than hide the row)."""
    try:
        return len(read_jsonl(events, lambda event: event.get("event") == "resumed"))
    except OSError:
        return 0


def train_run_name(config: dict[str, Any]) -> str:
    """Training runs are stored by a hash of the trial's full config: when a restored searcher
    suggests again a config whose trial it forgot, the new trial finds that work and resumes it
    instead of starting over."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    return f"run-{digest[:16]}"


def select_best(rows: list[TrialRow], max_slowdown: float | None = None) -> TrialRow | None:
    if max_slowdown is not None and rows:
        fastest = min(r.wall_s for r in rows)
        rows = [r for r in rows if r.wall_s <= max_slowdown * fastest]
    return min(rows, key=lambda r: (r.val_loss, r.wall_s)) if rows else None


class Experiment:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()

    @classmethod
    def named(cls, name: str, storage: str | Path | None = None) -> Experiment:
        return cls(Path(storage or RUNS) / name)

    # -- layout ----------------------------------------------------------------------------
    @property
    def tune_dir(self) -> Path:
        return self.root / "tune"

    @property
    def train_dir(self) -> Path:
        return self.root / "train"

    def trial_dir(self, trial_id: str) -> Path:
        return self.root / "trials" / trial_id

    def train_run_dir(self, trial_id: str) -> Path:
        """Where the trial's checkpoints lie, written by Ray Train or (one CPU worker) by the
        trial itself; named by the config it first ran with (`train_run_name`)."""
        record = self.read_trial_json(trial_id, "config.json") or {}
        return self.train_dir / record.get("train_run", f"trial-{trial_id}")

    def reconcile(self, known_trial_ids: set[str]) -> list[str]:
        """Move aside (never delete) trial folders Tune does not know: trials created after its
        last snapshot, which a restored Tune suggests again. Returns the ids moved."""
        moved = []
        for trial_id in self.trial_ids():
            if trial_id not in known_trial_ids:
                target = self.root / "trials" / ".orphaned" / trial_id
                target.parent.mkdir(parents=True, exist_ok=True)
                self.trial_dir(trial_id).rename(target)
                moved.append(trial_id)
        return moved

    # -- settings --------------------------------------------------------------------------
    def save_settings(self, settings: SweepSettings) -> None:
        """Write sweep.json: the folder's format number and how the sweep was launched."""
        recorded = {"format": FORMAT, **asdict(settings)}
        atomic_write_text(self.root / "sweep.json", json.dumps(recorded, indent=1))

    def settings(self) -> SweepSettings:
        path = self.root / "sweep.json"
        if not path.is_file():
            raise ConfigError(f"{self.root}: no sweep here (sweep.json not found)")
        try:
            recorded = json.loads(path.read_text())
            found = recorded.pop("format", None)
        except (ValueError, TypeError, AttributeError) as err:
            raise ConfigError(f"{path}: unreadable sweep settings ({err})") from None
        if found != FORMAT:
            raise ConfigError(
                f"{self.root}: an experiment folder of format {found or 'none'}; this version "
                f"of schedule-search reads format {FORMAT} (run the version that wrote it)"
            )
        try:
            return SweepSettings(**recorded)
        except TypeError as err:
            raise ConfigError(f"{path}: unreadable sweep settings ({err})") from None

    # -- per-trial records -----------------------------------------------------------------
    def log_driver(self, event: str, **fields: Any) -> None:
        """Appends the sweep driver's start or end to `driver.jsonl`: how long each launch of
        the sweep took, Ray's start-up included."""
        append_jsonl(self.root / "driver.jsonl", {"event": event, "time": time.time(), **fields})

    def write_trial_json(self, trial_id: str, name: str, data: Any) -> None:
        atomic_write_text(self.trial_dir(trial_id) / name, json.dumps(data, indent=1))

    def read_trial_json(self, trial_id: str, name: str) -> Any:
        path = self.trial_dir(trial_id) / name
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def trial_ids(self) -> list[str]:
        folder = self.root / "trials"
        if not folder.is_dir():
            return []
        return sorted(p.name for p in folder.iterdir() if (p / "config.json").is_file())

    def rows(self) -> list[TrialRow]:
        """One row per trial folder, from its records alone."""
        return [self._row(trial_id) for trial_id in self.trial_ids()]

    def _row(self, trial_id: str) -> TrialRow:
        records = read_records(self.trial_dir(trial_id))
        history, result = records.history, records.result
        if records.problem is not None:
            return TrialRow(trial_id, State.CORRUPT, records.params, reason=records.problem)
        row = TrialRow(
            trial_id, State(result.get("state", State.RUNNING if history else State.PENDING))
        )
        row.params = records.params
        row.reason = result.get("reason", "")
        row.trial_s = result.get("trial_s", math.nan)
        row.restarts = _restarts(self.trial_dir(trial_id) / "events.jsonl")
        if row.state == State.STOPPED and "milestone" in result:
            # The searcher was told the trial up to its stop; what it trained after the
            # STOP arrived is not its result (status, export and the journal agree).
            counted = [h for h in history if h.milestone <= result["milestone"]]
            if counted and len(counted) < len(history):
                told, trained = counted[-1].chinchilla, history[-1].chinchilla
                row.reason = (
                    f"{row.reason}; trained on to {trained:g}x before the stop arrived "
                    f"(not counted: the searcher was told {told:g}x)"
                )
            history = counted
        if not history:
            return row
        last = history[-1]
        row.chinchilla, row.tokens, row.val_loss = last.chinchilla, last.tokens, last.val_loss
        row.wall_s = last.wall_s
        row.ema_fraction = last.ema_fraction
        row.bank = {loss_key(f): loss for f, loss in last.losses.items()}
        row.curve = [(h.milestone, h.chinchilla, h.val_loss) for h in history]
        finite = [h.val_loss for h in history if math.isfinite(h.val_loss)]
        row.best_val_loss = min(finite) if finite else math.nan
        return row

    def finished(self, horizon: float) -> list[TrialRow]:
        """Trials that reached the horizon with a finite loss: the only ones comparable."""
        return [
            r
            for r in self.rows()
            if r.state == State.COMPLETED and r.chinchilla >= horizon and math.isfinite(r.val_loss)
        ]

    def problems(self) -> list[str]:
        """One line per trial whose records are damaged (`records`); those trials are shown as
        `corrupt` and never ranked."""
        return [r.reason for r in self.rows() if r.state == State.CORRUPT]

    def best(self, horizon: float, max_slowdown: float | None = None) -> TrialRow | None:
        """The lowest loss among trials that reached the horizon. With `max_slowdown`, only
        among those whose wall-clock time to the horizon is at most `max_slowdown` times the
        fastest such trial's: the choice lies on the loss/time Pareto front."""
        return select_best(self.finished(horizon), max_slowdown)

    def write_table(self) -> list[TrialRow]:
        rows = self.rows()
        params = sorted({k for r in rows for k in r.params})
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        columns = [
            "trial_id",
            "state",
            "chinchilla",
            "tokens",
            "val_loss",
            "best_val_loss",
            "ema_fraction",
            "wall_s",
            "trial_s",
            "restarts",
        ]
        writer.writerow(columns + params + ["reason"])
        for r in rows:
            writer.writerow(
                [getattr(r, c) for c in columns]
                + [r.params.get(p, "") for p in params]
                + [r.reason]
            )
        atomic_write_text(self.root / "trials.csv", buffer.getvalue())
        atomic_write_text(self.root / "trials.json", strict_json([asdict(r) for r in rows]))
        return rows
