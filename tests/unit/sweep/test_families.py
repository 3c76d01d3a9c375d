"""A space with families: the family is a searched choice, a family's params are searched in its
trials only (conditional in Optuna's terms), a point or value of the wrong family is refused in
one line, and the Optuna searcher and journal keep each family's params apart."""

import copy
import math

import optuna
import pytest
import yaml

from schedule_search.core.config import ConfigError
from schedule_search.sweep.optuna_study import suggest_family_trial, tpe_sampler
from schedule_search.sweep.searcher import searcher
from schedule_search.sweep.space import load_space, searched, trial_config, uses_asha

SPACE = {
    "name": "fam",
    "samples": 4,
    "base": {
        "task": {"name": "linreg", "dim": 16},
        "schedule": {"warmup": 0.0},
        "budget": {"horizon": 2.0, "eval_at": [1.0]},
    },
    "params": {"window.microbatches": {"type": "int", "low": 1, "high": 2}},
    "families": {
        "anytime": {
            "base": {"schedule": {"kind": "poly"}},
            "params": {
                "optimizer.lr": {"type": "loguniform", "low": 0.001, "high": 0.03},
                "schedule.gamma": {"type": "uniform", "low": 0.0, "high": 1.0},
            },
        },
        "schedulefree": {
            "base": {"optimizer": {"name": "schedulefree_adamw"}, "schedule": {"kind": "constant"}},
            "params": {
                "optimizer.lr": {"type": "loguniform", "low": 0.003, "high": 0.1},
                "schedule.warmup": {"type": "uniform", "low": 0.0, "high": 0.8},
            },
        },
    },
    "points_to_evaluate": [
        {
            "family": "anytime",
            "window.microbatches": 1,
            "anytime:optimizer.lr": 0.003,
            "anytime:schedule.gamma": 0.5,
        }
    ],
}


def write(tmp_path, space):
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    return path


def test_each_family_builds_its_own_config(tmp_path):
    space = load_space(write(tmp_path, SPACE))
    free = trial_config(
        space,
        {
            "family": "schedulefree",
            "window.microbatches": 2,
            "schedulefree:optimizer.lr": 0.05,
            "schedulefree:schedule.warmup": 0.2,
        },
    )
    assert free.optimizer.name == "schedulefree_adamw" and free.optimizer.lr == 0.05
    assert free.schedule.kind == "constant" and free.schedule.warmup == 0.2
    assert free.window.microbatches == 2 and free.task["dim"] == 16  # the shared base stays
    anytime = trial_config(space, space.points_to_evaluate[0])
    assert anytime.optimizer.name == "adamw" and anytime.schedule.kind == "poly"
    assert anytime.schedule.gamma == 0.5 and anytime.schedule.warmup == 0.0
    assert set(searched(space, "schedulefree")) == {
        "window.microbatches",
        "family",
        "schedulefree:optimizer.lr",
        "schedulefree:schedule.warmup",
    }
    assert uses_asha(space)  # both families are horizon-free


def test_a_value_of_another_family_is_refused(tmp_path):
    space = load_space(write(tmp_path, SPACE))
    with pytest.raises(ConfigError, match=r"schedulefree:optimizer\.lr: a param of family"):
        trial_config(space, {"family": "anytime", "schedulefree:optimizer.lr": 0.01})
    with pytest.raises(ConfigError, match="family: expected one of"):
        trial_config(space, {"family": "sgd"})


def broken(path: str, value):
    space = copy.deepcopy(SPACE)
    *parents, last = path.split("/")
    node = space
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[last] = value
    return space


@pytest.mark.parametrize(
    ("space", "message"),
    [
        (broken("points_to_evaluate/0/family", "sgd"), "points_to_evaluate[0].family"),
        (
            broken("points_to_evaluate/0/schedulefree:optimizer.lr", 0.01),
            "schedulefree:optimizer.lr is not a searched param",
        ),
        (
            broken("points_to_evaluate/0/anytime:optimizer.lr", 0.5),
            "points_to_evaluate[0].anytime:optimizer.lr: expected a number in [0.001, 0.03]",
        ),
        (
            broken(
                "families/schedulefree/params/schedule.kind",
                {"type": "choice", "values": ["cosine"]},
            ),
            "families.schedulefree.params.schedule.kind",
        ),
        (
            broken(
                "families/anytime/params/budget.horizon", {"type": "uniform", "low": 1, "high": 2}
            ),
            "families.anytime.params.budget.horizon: not searchable",
        ),
        (broken("families/anytime/base", {"optimizer": {"name": "lion"}}), "(in family anytime)"),
        (broken("params/family", {"type": "choice", "values": ["a"]}), "params.family"),
        (
            broken("families/anytime/base/budget", {"horizon": 8.0}),
            "families.anytime.base.budget: the same for every trial",
        ),
        (
            broken("families/anytime/base/task", {"name": "linreg", "dim": 8}),
            "families.anytime.base.task: the same for every trial",
        ),
        (
            broken(
                "families/anytime/params/window.microbatches", {"type": "int", "low": 1, "high": 2}
            ),
            "families.anytime.params.window.microbatches: searched in params already",
        ),
    ],
)
def test_a_bad_family_space_is_one_line_naming_the_key(tmp_path, space, message):
    with pytest.raises(ConfigError) as err:
        load_space(write(tmp_path, space))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_sampler_sees_each_familys_params_in_its_trials_only(tmp_path):
    """Optuna's own study, define-by-run as the searcher asks: every trial holds its family's
    params and no other's, each with its own family's distribution, and both families are
    proposed."""
    space = load_space(write(tmp_path, SPACE))
    study = optuna.create_study(sampler=tpe_sampler(seed=0, startup_trials=4))
    for _ in range(16):
        trial = study.ask()
        suggest_family_trial(space, trial)
        assert set(trial.params) == set(searched(space, trial.params["family"]))
        lr = trial.params[f"{trial.params['family']}:optimizer.lr"]
        # A made-up loss: schedule-free is better at high LR, the anytime family at low.
        loss = math.log(lr) ** 2 if trial.params["family"] == "anytime" else 1 + abs(math.log(lr))
        study.tell(trial, loss)
    families = {t.params["family"] for t in study.trials}
    assert families == {"anytime", "schedulefree"}
    # Past its start-up, grouped TPE models each family's own params (multivariate TPE
    # without groups would model only the params every trial shares: family, microbatches).
    modelled = study.sampler.infer_relative_search_space(study, study.ask())
    assert {"anytime:optimizer.lr", "schedulefree:optimizer.lr", "family"} <= set(modelled)


def test_gp_with_families_says_it_samples_their_params_at_random(tmp_path):
    from schedule_search.core.config import InputWarning

    with pytest.warns(InputWarning, match="sampler: gp does not model"):
        load_space(write(tmp_path, {**SPACE, "sampler": "gp"}))


def test_rays_searcher_suggests_the_point_then_conditional_trials(tmp_path):
    search = searcher(load_space(write(tmp_path, SPACE)))
    first = search.suggest("t0")
    assert first == SPACE["points_to_evaluate"][0]
    for i in range(1, 6):
        params = search.suggest(f"t{i}")
        family = params["family"]
        assert {k.partition(":")[0] for k in params if ":" in k} == {family}
        search.on_trial_complete(
            f"t{i}", {"val_loss": 1.0 + i, "milestone": 1, "status": "completed"}
        )


def test_the_searcher_of_a_family_space_saves_and_restores(tmp_path):
    """Tune snapshots the searcher with its define-by-run function (pickled with the space
    bound to it); a restored one goes on with the same study."""
    space = load_space(write(tmp_path, SPACE))
    search = searcher(space)
    for i in range(3):
        search.suggest(f"t{i}")
        search.on_trial_complete(
            f"t{i}", {"val_loss": 1.0 + i, "milestone": 1, "status": "completed"}
        )
    search.save(str(tmp_path / "searcher.pkl"))
    restored = searcher(space)
    restored.restore(str(tmp_path / "searcher.pkl"))
    assert len(restored._ot_study.trials) == 3
    params = restored.suggest("t3")
    assert {k.partition(":")[0] for k in params if ":" in k} == {params["family"]}
