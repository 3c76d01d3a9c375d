"""A sweep of the `hf_causal_lm` task: the shipped `hf_llama` space, shortened, runs two real
trials of a transformers Llama under Ray Tune and Ray Train and exports a recipe."""

import pytest
import yaml
from helpers import REPO
from sweeps import cli

from schedule_search.recipe import load_recipe
from schedule_search.store.experiment import Experiment

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.cost(30)]


def test_a_two_trial_sweep_of_the_shipped_llama_space(tmp_path):
    space = yaml.safe_load((REPO / "search_spaces" / "hf_llama.yaml").read_text())
    assert space["base"]["task"]["name"] == "hf_causal_lm"
    # The shipped model, on a short horizon: the machinery, not the search, is under test.
    space.update(samples=2, startup_trials=1, scheduler="fifo")
    space["base"]["budget"] = {"horizon": 0.1, "eval_at": [0.05]}
    path = tmp_path / "hf_llama.yaml"
    path.write_text(yaml.safe_dump(space))
    storage = tmp_path / "runs"

    done = cli("sweep", str(path), "--workers", "1", "--storage", str(storage))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    experiment = Experiment(storage / "hf_llama")
    trials = experiment.trial_ids()
    assert len(trials) == 2
    for trial in trials:
        result = experiment.read_trial_json(trial, "result.json")
        assert result["state"] == "completed", result
        assert 2.0 < result["val_loss"] < 6.0  # bytes: below uniform's ln 256 = 5.55

    exported = cli("export", "hf_llama", "--storage", str(storage), "-o", str(tmp_path / "r.yaml"))
    assert exported.returncode == 0, exported.stderr
    assert load_recipe(tmp_path / "r.yaml").spec.n_params > 50_000
