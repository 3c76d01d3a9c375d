"""A sweep over families: the shipped default space, shortened, runs real trials of both
families under Ray Tune with Optuna, each trial trains its own family's optimizer and schedule
with its own family's params only, and `status`, `optuna.journal` and `export` carry the
family."""

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from sweeps import cli_in_process, sweep_shipped_space

from schedule_search.recipe import load_recipe
from schedule_search.sweep.optuna_study import distribution
from schedule_search.sweep.space import load_space, searched

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.cost(30)]

OPTIMIZER = {"anytime": "adamw", "schedulefree": "schedulefree_adamw"}
#: What is asserted holds at any length of training (no loss bound, no count that grows with
#: it): the trials are as short as the shortened tinylm still evaluates in (~100 micro-batches).
HORIZON = 0.05


def test_a_sweep_of_the_shipped_families(tmp_path, capfd):
    space, experiment = sweep_shipped_space(capfd, tmp_path, "default", samples=4, horizon=HORIZON)
    assert set(space["families"]) == set(OPTIMIZER)
    storage, path = experiment.root.parent, tmp_path / "default.yaml"
    rows = experiment.rows()
    assert len(rows) == 4 and all(r.state == "completed" for r in rows)
    families = set()
    for row in rows:
        record = experiment.read_trial_json(row.trial_id, "config.json")
        family, params, config = row.family, record["params"], record["config"]
        families.add(family)
        assert config["optimizer"]["name"] == OPTIMIZER[family]
        owned = {key.partition(":")[0] for key in params if ":" in key}
        assert owned == {family}, params  # no value of the other family
        assert config["optimizer"]["lr"] == params[f"{family}:optimizer.lr"]
        if family == "schedulefree":
            assert config["schedule"]["kind"] == "constant"
            assert config["optimizer"]["betas"][0] == 0.9  # the family's base: not searched
            assert config["schedule"]["warmup"] == params["schedulefree:schedule.warmup"]
        else:
            assert config["schedule"]["gamma"] == params["anytime:schedule.gamma"]
    assert families == set(OPTIMIZER)  # the two points to evaluate, one of each

    # status and export start no Ray: run in this process (their own process is
    # test_store_without_ray's).
    status = cli_in_process(capfd, "status", "default", "--storage", str(storage))
    assert status.returncode == 0 and "family" in status.stdout
    assert "schedulefree" in status.stdout and "anytime" in status.stdout
    study = optuna.load_study(
        study_name="default",
        storage=JournalStorage(JournalFileBackend(str(experiment.root / "optuna.journal"))),
    )
    assert len(study.trials) == 4
    shipped = load_space(path)
    for trial in study.trials:  # each trial with its own family's distributions, as searched
        own = searched(shipped, trial.params["family"])
        assert trial.distributions == {name: distribution(p) for name, p in own.items()}

    output = tmp_path / "recipe.yaml"
    exported = cli_in_process(
        capfd, "export", "default", "--storage", str(storage), "-o", str(output)
    )
    assert exported.returncode == 0, exported.stderr
    recipe = load_recipe(output)
    best = experiment.best(HORIZON)
    assert recipe.spec.family == best.family
    assert recipe.spec.optimizer.name == OPTIMIZER[best.family]
    assert output.read_text().splitlines()[1] == f"# {recipe.how_to_evaluate}"
