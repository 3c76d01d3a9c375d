"""The sweep's search space in Optuna's terms, and its trials as an Optuna study on disk."""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path

import optuna

from schedule_search.experiment import Experiment
from schedule_search.space import SearchSpace, trial_config

# Optuna's INFO lines ("a new study created") would interleave with the sweep's live view.
optuna.logging.set_verbosity(optuna.logging.WARNING)


def tpe_sampler(seed: int, startup_trials: int) -> optuna.samplers.TPESampler:
    """TPE as the sweep runs it. `startup_trials` random trials before TPE models anything:
    Optuna's default of 10 would leave a sweep of a few trials to random search. Multivariate,
    because the searched keys interact (a faster decay tolerates a higher peak LR), which
    independent per-key densities cannot see; constant liar, so trials started together by
    concurrent workers do not all land on the same point."""
    with warnings.catch_warnings():  # both options are marked experimental, stable since 2.x
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=startup_trials, multivariate=True, constant_liar=True
        )


def optuna_distributions(space: SearchSpace) -> dict[str, optuna.distributions.BaseDistribution]:
    distributions: dict[str, optuna.distributions.BaseDistribution] = {}
    for key, p in space.params.items():
        if p.type == "choice":
            distributions[key] = optuna.distributions.CategoricalDistribution(p.values)
        elif p.type == "int":
            distributions[key] = optuna.distributions.IntDistribution(
                int(p.low), int(p.high), log=p.log
            )
        else:
            distributions[key] = optuna.distributions.FloatDistribution(
                p.low, p.high, log=p.log or p.type == "loguniform"
            )
    return distributions


def write_optuna_mirror(experiment: Experiment, space: SearchSpace) -> Path:
    """The trials as an Optuna study in a journal file (`optuna.journal`), so Optuna's tools
    (optuna-dashboard, `optuna.load_study`) can read a sweep. Written from the durable trial
    records, never the searcher's live state (RAY_NOTES: a live database can get ahead of a
    restored Tune snapshot). Trials stopped early keep their partial loss, marked by the
    `state` and `chinchilla` user attributes."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    from optuna.trial import TrialState, create_trial

    path = experiment.root / "optuna.journal"
    scratch = path.with_name(f".{path.name}.tmp")
    scratch.unlink(missing_ok=True)
    storage = JournalStorage(JournalFileBackend(str(scratch)))
    directions = ["minimize"] * len(space.objectives)
    study = optuna.create_study(study_name=space.name, storage=storage, directions=directions)
    distributions = optuna_distributions(space)
    base = trial_config(space, {})
    for row in experiment.rows(base.budget.horizon):
        if row.state in ("running", "pending"):
            continue
        values = [row.val_loss, row.wall_s][: len(space.objectives)]
        ok = row.state in ("completed", "stopped") and all(math.isfinite(v) for v in values)
        study.add_trial(
            create_trial(
                state=TrialState.COMPLETE if ok else TrialState.FAIL,
                values=values if ok else None,
                params=row.params,
                distributions={k: distributions[k] for k in row.params if k in distributions},
                user_attrs={
                    "trial_id": row.trial_id,
                    "state": row.state,
                    "chinchilla": row.chinchilla,
                    "reason": row.reason,
                },
            )
        )
    os.replace(scratch, path)
    return path
