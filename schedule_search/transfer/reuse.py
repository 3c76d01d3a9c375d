"""Runs of an earlier transfer reused by a new one (`transfer --reuse FOLDER`): a run the new
plan asks for under the same name and the same config, and that ended in the earlier
transfer, is copied into the round that plans it instead of being trained again.

Why: a study launched again with one rule changed (constant + EMA's LR tuned, say) shares
most of its runs with the one before, hours of training. The plan stays a function of
finished results: a copy is a record like any run that ended in its round, read back when the
round is replayed. Configs are compared whole after parsing (a field added since takes its
default on both sides), `branch_from` included, so a branch or continuation is reused only
off the very checkpoint file it started from, and every seed's replica only as itself. What a
config does not hold must match too: the earlier transfer scored every seed on the shared
held-out sample and ran on as many workers (each rank's data stream depends on it). Not
checked: the code and the hardware; reuse a transfer made by the same version on the same
kind of machine. A copy goes only into a round Tune has not started, under an id Tune never
gives (`reused-<id>`); its trial folder appears whole (copied beside, then renamed), its
events say where it came from, and its checkpoints come as hard links where the file system
allows (else copies). A run whose train folder is gone (a packed transfer keeps only the
checkpoints its own rest needs) is trained again; a branch off a copy whose checkpoints were
pruned stops with the lookup's error.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schedule_search.core.config import ConfigError, parse, to_dict
from schedule_search.core.files import append_jsonl
from schedule_search.core.states import KEPT
from schedule_search.store.experiment import Experiment
from schedule_search.train.config import TrainConfig

__all__ = ["REUSED", "Donor", "copy_ended_runs", "read_donor"]

#: The start of a copy's trial id: Tune's ids are hex, so it never gives one of these.
REUSED = "reused-"


@dataclass(frozen=True)
class EndedRun:
    """A run that ended in the earlier transfer: its config (as compared) and its folders."""

    config: str
    trial: Path
    train: Path


@dataclass(frozen=True)
class Donor:
    """The ended runs of an earlier transfer's folder, by name."""

    folder: Path
    runs: dict[str, EndedRun]


def read_donor(folder: Path, workers: int, held_out: str) -> Donor:
    """The ended runs of the transfer folder `folder` (its `round<k>/trials/`), refused where
    they could not stand for runs of a transfer on `workers` workers scored on `held_out`."""
    try:
        launched = json.loads((folder / "launch.json").read_text())
    except (OSError, ValueError):
        launched = None
    if not isinstance(launched, dict) or not any(folder.glob("round*/trials")):
        raise ConfigError(
            f"--reuse {folder}: expected the folder of an earlier transfer (launch.json, "
            "round<k>/trials/)"
        )
    if launched.get("held_out") != held_out:
        raise ConfigError(
            f"--reuse {folder}: its runs were scored each on its seed's own held-out sample; "
            "runs made now share one"
        )
    if launched.get("workers") != workers:
        raise ConfigError(
            f"--reuse {folder}: its runs trained on {launched.get('workers')} worker(s), this "
            f"transfer's on {workers} (each rank draws its own data)"
        )
    runs: dict[str, EndedRun] = {}
    seen: dict[str, int] = {}
    for trial in folder.glob("round*/trials/*"):
        phase = Experiment(trial.parent.parent)
        record = phase.read_trial_json(trial.name, "config.json")
        ending = phase.read_trial_json(trial.name, "result.json")
        if not record or not ending or ending.get("state") not in KEPT:
            continue
        try:
            config = _compared(record["config"], str(trial / "config.json"))
            name = record["params"]["run"]
        except (ConfigError, KeyError, TypeError):
            continue  # a record this version cannot read is never reused
        seen[name] = seen.get(name, 0) + 1
        train = trial.parent.parent / "train" / record.get("train_run", f"trial-{trial.name}")
        if train.is_dir():
            runs[name] = EndedRun(config, trial, train)
    # A name that ended twice (in two rounds) is ambiguous: neither is copied.
    return Donor(folder, {name: run for name, run in runs.items() if seen[name] == 1})


def copy_ended_runs(
    phase: Experiment, pending: dict[str, dict[str, Any]], donor: Donor
) -> list[str]:
    """Copy into the round `phase` every run of `pending` that `donor` holds, ended, under the
    same name and config; return their names (no longer to be trained). Nothing is copied
    into a round Tune has started: its grid holds every run it was to train."""
    if phase.tune_dir.exists():
        return []
    present = {
        (phase.read_trial_json(trial, "config.json") or {}).get("params", {}).get("run")
        for trial in phase.trial_ids()
    }
    copied = []
    for name, config in pending.items():
        ended = donor.runs.get(name)
        if name in present or ended is None:
            continue
        if ended.config != _compared(config, f"transfer run {name}"):
            continue
        train = phase.train_dir / ended.train.name
        if not train.exists():
            _place(ended.train, train, phase, copy_function=_link_or_copy)
        target = phase.trial_dir(f"{REUSED}{ended.trial.name}")
        _place(ended.trial, target, phase, reused_from=ended.trial)
        copied.append(name)
    with contextlib.suppress(OSError):  # the staging folder, once empty
        (phase.root / ".reusing").rmdir()
    return copied


def _place(
    source: Path,
    target: Path,
    phase: Experiment,
    reused_from: Path | None = None,
    copy_function: Any = shutil.copy2,
) -> None:
    """Copy `source` to `target` whole: beside the round's folders first (a copy a kill cut
    short is made again, never read), then renamed into place."""
    partial = phase.root / ".reusing" / target.name
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial, copy_function=copy_function)
    if reused_from is not None:
        append_jsonl(partial / "events.jsonl", {"event": "reused", "from": str(reused_from)})
    target.parent.mkdir(parents=True, exist_ok=True)
    partial.rename(target)


def _compared(config: dict[str, Any], where: str) -> str:
    return json.dumps(to_dict(parse(TrainConfig, config, where)), sort_keys=True)


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
