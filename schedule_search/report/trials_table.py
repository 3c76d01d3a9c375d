"""The console's table of a sweep's trials (`status`, and a sweep's end): one row per trial,
best first, one column per searched training config key."""

from __future__ import annotations

from rich.table import Table

from schedule_search.core.averaging import fraction_label
from schedule_search.core.states import State
from schedule_search.store.experiment import FAMILY, Experiment, TrialRow
from schedule_search.sweep.space import config_key, short_name, value_text

__all__ = ["trials_table"]


def trials_table(experiment: Experiment, rows: list[TrialRow], horizon: float) -> Table:
    """`rows` as a table, the trial `export` picks at `horizon` marked with a star."""
    best = experiment.best(horizon)
    table = Table(title=f"{experiment.root.name}: {len(rows)} trials (objective at {horizon:g}x)")
    # One column per training config key: a family's own params share the column of their
    # key (each trial holds its family's value), the family first.
    by_key = {r.trial_id: {config_key(k): v for k, v in r.params.items()} for r in rows}
    keys = sorted({k for values in by_key.values() for k in values}, key=lambda k: (k != FAMILY, k))
    headers = [short_name(k) for k in keys]
    if len(set(headers)) < len(headers):
        headers = keys
    restarted = any(r.restarts for r in rows)  # a column only once a fault has happened
    fixed = ["trial", "state", "reached", "val_loss", "ema fraction", "best"]
    for column in [*fixed, *(["restarts"] if restarted else []), *headers]:
        table.add_column(column)
    for r in sorted(rows, key=lambda r: (r.state != State.COMPLETED, r.val_loss)):
        mark = " *" if best is not None and r.trial_id == best.trial_id else ""
        table.add_row(
            r.trial_id + mark,
            r.state,
            f"{r.chinchilla:g}x",
            f"{r.val_loss:.4f}",
            fraction_label(r.ema_fraction),
            f"{r.best_val_loss:.4f}",
            *([str(r.restarts)] if restarted else []),
            *[value_text(by_key[r.trial_id].get(key, "")) for key in keys],
        )
    return table
