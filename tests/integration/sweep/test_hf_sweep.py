"""A sweep of the `hf_causal_lm` task: the shipped `hf_llama` space, shortened, runs two real
trials of a transformers Llama under Ray Tune and Ray Train and exports a recipe."""

import pytest
from sweeps import cli_in_process, sweep_shipped_space

from schedule_search.recipe import load_recipe

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.cost(45)]


def test_a_two_trial_sweep_of_the_shipped_llama_space(tmp_path, capfd):
    space, experiment = sweep_shipped_space(capfd, tmp_path, "hf_llama", samples=2)
    assert space["base"]["task"]["name"] == "hf_causal_lm"
    storage = experiment.root.parent
    trials = experiment.trial_ids()
    assert len(trials) == 2
    for trial in trials:
        result = experiment.read_trial_json(trial, "result.json")
        assert result["state"] == "completed", result
        assert 2.0 < result["val_loss"] < 6.0  # bytes: below uniform's ln 256 = 5.55

    # export starts no Ray: run in this process (its own process is test_store_without_ray's)
    recipe = str(tmp_path / "r.yaml")
    exported = cli_in_process(capfd, "export", "hf_llama", "--storage", str(storage), "-o", recipe)
    assert exported.returncode == 0, exported.stderr
    assert load_recipe(tmp_path / "r.yaml").spec.n_params > 50_000
