"""The searcher reads three private attributes of Ray's OptunaSearch (`RAY_INTERNALS`): a Ray
release that renames or retypes them fails here, not in the middle of a user's sweep."""

from pathlib import Path

import optuna
import pytest

from schedule_search.sweep.searcher import (
    RAY_INTERNALS,
    MilestoneOptunaSearch,
    scheduler,
    searcher,
)
from schedule_search.sweep.space import load_space, trial_config

SPACES = Path(__file__).resolve().parents[3] / "search_spaces"


def test_rays_optuna_search_still_has_what_the_searcher_uses():
    search = searcher(load_space(SPACES / "linreg.yaml", check_task=False))
    assert isinstance(search, MilestoneOptunaSearch)
    for name in RAY_INTERNALS:
        assert hasattr(search, name), name
    suggested = search.suggest("t1")
    assert isinstance(suggested, dict) and suggested
    assert isinstance(search._ot_study, optuna.Study)
    assert isinstance(search._ot_trials["t1"], optuna.Trial)
    assert isinstance(search._completed_trials, set)
    search.on_trial_result("t1", {"val_loss": 1.5, "milestone": 2})
    search.on_trial_complete("t1", {"val_loss": 1.25, "milestone": 3, "status": "completed"})
    (trial,) = search._ot_study.trials
    assert trial.intermediate_values == {2: 1.5, 3: 1.25}
    assert trial.value == 1.25 and "t1" in search._completed_trials


def test_a_missing_internal_fails_at_construction(monkeypatch):
    from ray.tune.search.optuna import OptunaSearch

    original = OptunaSearch.__init__

    def without_trials(self, *args, **kwargs):
        original(self, *args, **kwargs)
        del self._ot_trials

    monkeypatch.setattr(OptunaSearch, "__init__", without_trials)
    with pytest.raises(RuntimeError, match="no longer has _ot_trials"):
        searcher(load_space(SPACES / "linreg.yaml", check_task=False))


def test_ashas_first_rung_is_the_spaces_else_1x():
    """The default space halves from 0.5x (bench/family_search.py chose it); a space that names
    no first rung halves from 1x. Read from Ray's own ASHA, as its rungs (Chinchilla x)."""

    def rungs(space) -> list[float]:
        milestones = trial_config(space, {}).budget.milestones()
        asha = scheduler(space, milestones[-1], milestones)
        return sorted(rung for rung, _ in asha._brackets[0]._rungs)

    default = load_space(SPACES / "default.yaml")
    assert default.first_rung == 0.5 and rungs(default) == [0.5, 1.0, 2.0, 4.0]
    # The default also evaluates at 3x, for the forecast: not a rung, so ASHA stops no trial
    # there (and an evaluation changes no run: test_train's more-often test).
    assert trial_config(default, {}).budget.milestones() == [0.5, 1.0, 2.0, 3.0, 4.0]
    linreg = load_space(SPACES / "linreg.yaml")
    assert linreg.first_rung is None and min(rungs(linreg)) == 1.0
