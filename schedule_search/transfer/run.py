"""Transfer: run the exported recipe to longer horizons against the references a skeptic would
pick (what runs: `transfer.plan`), round by round, and write the table.

Each round is a Tune experiment of core-trainer trials (the sweep's own machinery) holding
every run that can start given the runs finished before it: the first round trains the recipe
(continued from the sweep's checkpoint), the constant trunk and the start points of the LR
grids; later rounds extend grids whose best LR is at an edge, start linear-to-zero grids around
cosine's best, branch WSD off the trunk and continue schedule-free AdamW's best LR. Rounds are
decided from finished results only, so a killed transfer, run again, resumes the round it was in
and decides the same rounds after it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray import tune

from schedule_search.core import checkpoint as ckpt
from schedule_search.core.config import ConfigError, parse, to_dict
from schedule_search.core.files import atomic_write_text
from schedule_search.core.states import KEPT
from schedule_search.recipe.export import exported_trial
from schedule_search.store.experiment import Experiment, SweepSettings
from schedule_search.store.facts import read_facts
from schedule_search.store.records import read_records
from schedule_search.sweep.driver import run_tune
from schedule_search.sweep.live_view import LiveView
from schedule_search.sweep.ray_env import ray_session
from schedule_search.train.config import TrainConfig
from schedule_search.transfer.plan import CONSTANT_LR, METHODS, WSD, TransferStudy
from schedule_search.transfer.reuse import Donor, copy_ended_runs, read_donor
from schedule_search.transfer.scores import History
from schedule_search.transfer.seeds import pending_with_seeds

__all__ = [
    "METHODS",
    "SHARED_HELD_OUT",
    "TransferOutcome",
    "Unfinished",
    "build_study",
    "run_transfer",
    "transfer_base",
]


def recipe_config(sweep: Experiment) -> tuple[TrainConfig, str, float]:
    """The full training config of the trial the sweep exported (or would export), its id,
    and the EMA fraction the recipe evaluates with."""
    trial_id, fraction = exported_trial(sweep)
    record = sweep.read_trial_json(trial_id, "config.json")
    if record is None:
        raise ConfigError(f"{sweep.root}: trial {trial_id} of the recipe has no config.json")
    return parse(TrainConfig, record["config"], f"trial {trial_id}"), trial_id, fraction


def transfer_base(sweep: Experiment, workers: int) -> tuple[TrainConfig, str]:
    """The recipe's config for runs on `workers` workers, scored with the recipe's EMA
    fraction (`on_workers`)."""
    base, trial_id, fraction = recipe_config(sweep)
    tree = on_workers(to_dict(base), sweep.settings().workers, workers)
    tree["ema"]["objective"] = fraction
    return parse(TrainConfig, tree, f"trial {trial_id} on {workers} workers"), trial_id


def on_workers(tree: dict[str, Any], tuned_on: int, workers: int) -> dict[str, Any]:
    """A config `tree` tuned on `tuned_on` workers, for `workers`: a window of micro-batches is
    counted per rank, so it is rescaled to keep the tokens per optimizer step (the batch size
    its LR was tuned for); a `tokens` window counts the total over ranks already."""
    window = tree["window"]
    if workers == tuned_on or window["policy"] != "microbatches":
        return tree
    total = window["microbatches"] * tuned_on
    if total % workers:
        raise ConfigError(
            f"--workers {workers}: the recipe steps every {total} micro-batches "
            f"({window['microbatches']} per rank on {tuned_on} workers), which {workers} "
            "workers cannot split evenly"
        )
    return {**tree, "window": {**window, "microbatches": total // workers}}


def continuation(sweep: Experiment, trial_id: str, base: TrainConfig, workers: int) -> str | None:
    """The sweep trial's checkpoint at the sweep's horizon, when the recipe run can continue
    from it: the same config (but for its budget and its objective) and the same tokens per
    optimizer step, and a checkpoint that got there.

    On another number of workers only windows whose tokens per step do not depend on it
    (`microbatches`, rescaled by `on_workers`, and `tokens`) continue; the run then draws
    rank 0's data stream from rank 0's position (`train.state.restore`), fresh text from
    the same corpus rather than the micro-batches the sweep's other ranks would have drawn."""
    record = sweep.read_trial_json(trial_id, "config.json") or {}
    history = read_records(sweep.trial_dir(trial_id)).history
    tuned_on = sweep.settings().workers
    if not history or "config" not in record:
        return None
    if workers != tuned_on and base.window.policy not in ("microbatches", "tokens"):
        return None
    ignored = {"budget", "checkpoint", "branch_from"}
    # Both through the parser, so fields added since the sweep ran take their defaults.
    recorded = to_dict(parse(TrainConfig, record["config"], f"trial {trial_id}"))
    recorded = on_workers(recorded, tuned_on, workers)
    trained, ours = (json.loads(json.dumps(tree)) for tree in (recorded, to_dict(base)))
    for tree in (trained, ours):
        tree["ema"]["objective"] = None
    if {k: v for k, v in trained.items() if k not in ignored} != {
        k: v for k, v in ours.items() if k not in ignored
    }:
        return None
    token_clock = history[-1].token_clock(base.budget.tokens_per_param)
    needed = token_clock.tokens(read_facts(sweep.root).horizon)
    folders = ckpt.checkpoint_folders(sweep.train_run_dir(trial_id))
    reached = [f for f in folders if _tokens(f) >= needed]
    return str(reached[0]) if reached else None


def build_study(
    sweep: Experiment,
    settings: SweepSettings,
    horizons: list[float],
    methods: list[str],
    constant_lr: str = CONSTANT_LR[0],
) -> tuple[TransferStudy, str]:
    """The transfer of the sweep's recipe to `horizons` on `settings.workers` workers, its
    constant trunk's LR chosen by the rule `constant_lr`."""
    base, trial_id = transfer_base(sweep, settings.workers)
    start = continuation(sweep, trial_id, base, settings.workers) if "recipe" in methods else None
    study = TransferStudy(
        base,
        horizons,
        methods,
        base.budget.horizon,
        start,
        trial_id if start else None,
        constant_lr,
    )
    study.pending({}, lambda run, multiple: Path())  # every first-round config is valid
    if study.has_trunk:  # the trunk continued once its grid has picked: checked now
        trunk = study.trunk(study.adamw_lr, study.top, "." if constant_lr == "tuned" else None)
        parse(TrainConfig, trunk, "transfer run constant")
    if "wsd" in methods:  # built once the constant run has ended, hours in: checked now
        for prefix in WSD:
            for h in study.horizons:
                branch = study.wsd(prefix, h, Path(), study.adamw_lr)
                parse(TrainConfig, branch, f"transfer run {prefix}-{h:g}x")
    return study, trial_id


@dataclass(frozen=True)
class TransferOutcome:
    """A finished study, what its report is written from: its folder, its plan, every run's
    records, and the recipe trial's own history at the sweep's horizon."""

    root: Path
    study: TransferStudy
    records: dict[str, Any]
    sweep_history: History


#: launch.json's mark of a transfer whose seeds are all scored on the task's one held-out
#: sample (`tinylm.HELD_OUT_KEY`); one without it drew a sample per seed.
SHARED_HELD_OUT = "shared"


def run_transfer(
    sweep: Experiment,
    settings: SweepSettings,
    horizons: list[float],
    methods: list[str],
    resume: bool,
    seeds: int = 1,
    constant_lr: str = CONSTANT_LR[0],
    reuse: Path | None = None,
) -> TransferOutcome:
    """Run (or resume) the transfer study of `sweep` to its end, with `seeds` seeds of every
    row (`transfer.seeds`), copying the runs the earlier transfer `reuse` ended
    (`transfer.reuse`)."""
    study, trial_id = build_study(sweep, settings, horizons, methods, constant_lr)
    root = sweep.root / "transfer"
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        root / "launch.json",
        json.dumps(
            {
                "recipe_trial": trial_id,
                "continued_from": study.continue_from,
                "horizons": study.horizons,
                "to": [h for h in study.horizons if h != study.sweep_horizon],
                "methods": methods,
                "workers": settings.workers,
                "concurrency": settings.concurrency,
                "seeds": seeds,
                "held_out": SHARED_HELD_OUT,
                "constant_lr": study.constant_lr,
                "reuse": str(reuse) if reuse else None,
            },
            indent=1,
        ),
    )
    donor = read_donor(reuse, settings.workers, SHARED_HELD_OUT) if reuse else None
    with contextlib.ExitStack() as stack:
        # Ray starts where a round first has a run to train: a transfer whose runs are all
        # copied (`--reuse`) or all ended (its report written again) starts none.
        started: list[None] = []

        def start_ray() -> None:
            if not started:
                stack.enter_context(ray_session(settings, study.base.task, sweep.root))
                started.append(None)

        records = _run_rounds(study, root, settings, resume, seeds, donor, start_ray)
    return TransferOutcome(root, study, records, read_records(sweep.trial_dir(trial_id)).history)


def _run_rounds(
    study: TransferStudy,
    root: Path,
    settings: SweepSettings,
    resume: bool,
    seeds: int,
    donor: Donor | None,
    start_ray: Callable[[], None],
) -> dict[str, RunRecord]:
    """Every round until nothing is pending (Ray started by `start_ray` before the first
    that trains); what each run did."""
    finished: dict[str, History] = {}
    where: dict[str, tuple[Experiment, str]] = {}

    def checkpoint_at(run: str, multiple: float) -> Path:
        phase, trial = where[run]
        tokens = finished[run][-1].token_clock(study.base.budget.tokens_per_param).tokens(multiple)
        for folder in ckpt.checkpoint_folders(phase.train_run_dir(trial)):
            if _tokens(folder) >= tokens:
                return folder
        raise RuntimeError(f"run {run} has no checkpoint at or after {multiple:g}x")

    for number in itertools.count(1):
        phase = Experiment(root / f"round{number}")
        # On resume a round is replayed: what ended in it is read back, not planned again.
        ended = frozenset(ended_runs(phase))
        pending = pending_with_seeds(study, seeds, finished, checkpoint_at, ended)
        if donor is not None:
            pending, ended = _copy_from(donor, phase, pending, ended)
        if not pending and not ended:
            break
        # Longest runs first (by what they train, a branch from where it starts): with runs in
        # parallel, a long run started last would train alone.
        names = sorted(pending, key=lambda n: (-study.length(pending[n]), n))
        if names:  # what ended in this round is not pending: only the rest runs
            start_ray()
            run_tune(
                phase,
                settings,
                PlannedRuns(pending),
                tune.TuneConfig(
                    max_concurrent_trials=settings.concurrency,
                    reuse_actors=settings.in_process,
                ),
                {"run": tune.grid_search(names)},
                _live_view({n: study.span(pending[n]) for n in names}),
                resume and phase.tune_dir.exists(),
                set_aside_orphans=False,  # each reports its record: see `run_tune`
            )
        _require_finished(phase, names)
        for name, trial in run_names(phase).items():
            finished[name] = read_records(phase.trial_dir(trial)).history
            where[name] = (phase, trial)
    return {
        name: RunRecord(
            history=finished[name],
            config=(phase.read_trial_json(trial, "config.json") or {}).get("config", {}),
            where=f"{phase.root.name}/{trial}",
        )
        for name, (phase, trial) in where.items()
    }


def _copy_from(
    donor: Donor, phase: Experiment, pending: dict[str, Any], ended: frozenset[str]
) -> tuple[dict[str, Any], frozenset[str]]:
    """The round's pending runs and its ended ones once `donor`'s have been copied in."""
    copied = copy_ended_runs(phase, pending, donor)
    if copied:
        print(f"{phase.root.name}: {len(copied)} run(s) copied from {donor.folder}", flush=True)
    rest = {name: config for name, config in pending.items() if name not in copied}
    return rest, ended | frozenset(copied)


@dataclass
class RunRecord:
    """A finished transfer run: its evaluations, its training config, and where it lies
    (`round<k>/<trial id>` under transfer/)."""

    history: History
    config: dict[str, Any]
    where: str


def _tokens(folder: Path) -> int:
    return int(folder.name.removeprefix(ckpt.PREFIX))


class PlannedRuns:
    """Resolves a transfer trial's `run` name into its config."""

    def __init__(self, runs: dict[str, dict[str, Any]]) -> None:
        self.runs = runs

    def __call__(self, params: dict[str, Any], trial_id: str) -> TrainConfig:
        return parse(TrainConfig, self.runs[params["run"]], f"transfer run {params['run']}")


def run_names(transfer: Experiment) -> dict[str, str]:
    """run name -> trial id, for runs that have a trial folder."""
    names = {}
    for trial_id in transfer.trial_ids():
        params = (transfer.read_trial_json(trial_id, "config.json") or {}).get("params", {})
        if "run" in params:
            names[params["run"]] = trial_id
    return names


class Unfinished(Exception):
    """The transfer stopped with runs unfinished (interrupted, or a run failed for good)."""


def ended_runs(phase: Experiment) -> list[str]:
    """Runs of this round that ended for good (`core.states.KEPT`): an errored one is pending
    again, and the next resume trains it."""
    trial_ids = run_names(phase) if phase.root.exists() else {}
    endings = {n: phase.read_trial_json(trial, "result.json") for n, trial in trial_ids.items()}
    return [n for n, ending in endings.items() if ending and ending.get("state") in KEPT]


def _unfinished(phase: Experiment, names: list[str]) -> list[str]:
    """Runs of `names` that did not end for good: still pending (killed before their first
    evaluation), interrupted, or failed."""
    ended = set(ended_runs(phase))
    return [n for n in names if n not in ended]


def _require_finished(phase: Experiment, names: list[str]) -> None:
    """Tune returns on Ctrl-C too: go on to the next round or the report only when every run
    of this one has ended."""
    unfinished = _unfinished(phase, names)
    if unfinished:
        raise Unfinished(
            f"{len(unfinished)} of {len(names)} runs of {phase.root.name} unfinished "
            f"({', '.join(unfinished[:4])}{', ...' if len(unfinished) > 4 else ''})"
        )


def _live_view(spans: dict[str, tuple[float, float]]):
    """The live view of one round: its runs and the Chinchilla multiples each trains over."""
    return LiveView(
        len(spans), sum(end - start for start, end in spans.values()), lambda p: spans[p["run"]]
    )
