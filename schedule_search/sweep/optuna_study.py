"""The sweep's search space in Optuna's terms, and its trials as an Optuna study on disk."""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import Any, Literal

import optuna

from schedule_search.core.states import State
from schedule_search.store.experiment import Experiment
from schedule_search.sweep.space import FAMILY, Param, SearchSpace, searched

__all__ = [
    "SAMPLERS",
    "distribution",
    "make_sampler",
    "optuna_distributions",
    "suggest_family_trial",
    "tpe_sampler",
    "trial_state",
    "write_optuna_mirror",
]

# Optuna's INFO lines ("a new study created") would interleave with the sweep's live view.
optuna.logging.set_verbosity(optuna.logging.WARNING)


#: The samplers a space may name (`sampler:`); `bench/search.py` measures them at the default
#: sweep's budget and the default is the one that measured best there.
SAMPLERS = ("tpe", "gp", "random")


def make_sampler(name: str, seed: int, startup_trials: int) -> optuna.samplers.BaseSampler:
    """The space's sampler, seeded. TPE and GP start modelling after `startup_trials` random
    trials (`points_to_evaluate` count among them)."""
    if name == "tpe":
        return tpe_sampler(seed, startup_trials)
    if name == "gp":
        # GP regression over the searched keys (Optuna's GPSampler, needs scipy); it learns
        # from completed trials only, so trials the scheduler pruned teach it nothing.
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup_trials)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"sampler: expected one of {', '.join(SAMPLERS)}, got {name!r}")


def tpe_sampler(seed: int, startup_trials: int, **options: Any) -> optuna.samplers.TPESampler:
    """TPE as the sweep runs it. `startup_trials` random trials before TPE models anything:
    Optuna's default of 10 would leave a sweep of a few trials to random search. Multivariate,
    because the searched keys interact (a faster decay tolerates a higher peak LR), which
    independent per-key densities cannot see; constant liar, so trials started together by
    concurrent workers do not all land on the same point; grouped, so that a space with families
    (conditional params) is modelled family by family rather than on the params all trials
    share. Trials a scheduler stopped early are
    PRUNED with their intermediate values: TPE ranks them below every completed trial, and
    among themselves by how far they got and their last loss. `options` override these or
    set others of TPESampler's (bench/family_search.py measures some; the sweep passes none)."""
    chosen = {"multivariate": True, "group": True, "constant_liar": True} | options
    with warnings.catch_warnings():  # both options are marked experimental, stable since 2.x
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup_trials, **chosen)


def trial_state(row_state: State, values: list[float]) -> optuna.trial.TrialState:
    """How a finished trial is told to Optuna, by the live searcher and in the journal alike:
    a trial that reached the horizon is COMPLETE (a diverged one with an infinite loss, so a
    sampler learns to avoid its region); one the scheduler stopped early is PRUNED (its loss at
    a lower milestone is not comparable with losses at the horizon); an error is FAIL."""
    if row_state == State.STOPPED:
        return optuna.trial.TrialState.PRUNED
    if row_state in (State.COMPLETED, State.DIVERGED) and not any(math.isnan(v) for v in values):
        return optuna.trial.TrialState.COMPLETE
    return optuna.trial.TrialState.FAIL


def optuna_distributions(space: SearchSpace) -> dict[str, optuna.distributions.BaseDistribution]:
    """Every searched name's distribution (of every family: `space.searched`)."""
    return {name: distribution(p) for name, p in searched(space).items()}


def distribution(p: Param) -> optuna.distributions.BaseDistribution:
    # `Param` has checked that a choice has values and every other type its bounds.
    if p.type == "choice":
        assert p.values is not None
        return optuna.distributions.CategoricalDistribution(p.values)
    assert p.low is not None and p.high is not None
    if p.type == "int":
        return optuna.distributions.IntDistribution(int(p.low), int(p.high), log=p.log)
    return optuna.distributions.FloatDistribution(
        p.low, p.high, log=p.log or p.type == "loguniform"
    )


def suggest_family_trial(space: SearchSpace, trial: optuna.Trial) -> None:
    """A trial of a space with families, define-by-run: its family first, then the shared
    params and that family's own. Optuna sees each family's params only in that family's
    trials (TPE with `group=True` models each family's group apart)."""
    family = trial.suggest_categorical(FAMILY, list(space.families))
    for name, p in searched(space, str(family)).items():
        if name == FAMILY:
            continue
        if p.type == "choice":
            trial.suggest_categorical(name, p.values)  # type: ignore[arg-type]
        elif p.type == "int":
            trial.suggest_int(name, int(p.low), int(p.high), log=p.log)  # type: ignore[arg-type]
        else:
            log = p.log or p.type == "loguniform"
            trial.suggest_float(name, p.low, p.high, log=log)  # type: ignore[arg-type]


def write_optuna_mirror(experiment: Experiment, space: SearchSpace) -> Path:
    """The trials as an Optuna study in a journal file (`optuna.journal`), so Optuna's tools
    (optuna-dashboard, `optuna.load_study`) can read a sweep. Written from the durable trial
    records, never the searcher's live state (a live database can get ahead of a restored
    Tune snapshot), in the terms the live searcher is told (`trial_state`): every
    evaluation is an intermediate value at its milestone index, a trial stopped early is
    PRUNED, a completed one COMPLETE with its loss at the horizon. The EMA fraction the loss
    came from is the `ema_fraction` user attribute; `bank` holds every fraction's loss at the
    trial's last evaluation."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    from optuna.trial import TrialState, create_trial

    path = experiment.root / "optuna.journal"
    scratch = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    scratch.unlink(missing_ok=True)
    storage = JournalStorage(JournalFileBackend(str(scratch)))
    directions: list[Literal["minimize", "maximize"]] = ["minimize"] * len(space.objectives)
    study = optuna.create_study(study_name=space.name, storage=storage, directions=directions)
    distributions = optuna_distributions(space)
    single = len(space.objectives) == 1
    for row in experiment.rows():
        if row.state in (State.RUNNING, State.PENDING):
            continue
        values = [row.val_loss, row.wall_s][: len(space.objectives)]
        state = trial_state(row.state, values)
        if state == TrialState.PRUNED and single and row.curve:
            # Optuna's tell gives a pruned trial its last value.
            told: list[float] | None = [row.curve[-1][2]]
        else:
            told = values if state == TrialState.COMPLETE else None
        study.add_trial(
            create_trial(
                state=state,
                values=told,
                params=row.params,
                distributions={k: distributions[k] for k in row.params if k in distributions},
                intermediate_values={
                    step: loss for step, _, loss in row.curve if not math.isnan(loss)
                }
                if single
                else None,
                user_attrs={
                    "trial_id": row.trial_id,
                    "state": row.state,
                    "chinchilla": row.chinchilla,
                    "ema_fraction": row.ema_fraction,
                    "bank": row.bank,
                    "reason": row.reason,
                },
            )
        )
    os.replace(scratch, path)
    return path
