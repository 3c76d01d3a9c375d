"""The trials table a user reads (trials.json beside trials.csv) is JSON any parser reads: a
trial not yet evaluated has no loss, written as null, not as Python's NaN."""

import math

from helpers import strict_loads

from schedule_search.store.experiment import Experiment, SweepSettings
from schedule_search.train.evaluation import Evaluation


def test_a_trial_not_yet_evaluated_is_null_in_trials_json(tmp_path):
    experiment = Experiment(tmp_path / "lin")
    experiment.root.mkdir()
    experiment.save_settings(SweepSettings(name="lin", samples=2, workers=1, concurrency=1))
    config = {"optimizer": {"name": "sgd", "lr": 0.1}}
    for trial_id in ("done", "waiting"):
        experiment.write_trial_json(trial_id, "config.json", {"params": {}, "config": config})
    evaluated = Evaluation(tokens=64, chinchilla=1.0, val_loss=0.5, milestone=1, losses={0.0: 0.5})
    experiment.write_trial_json("done", "metrics.json", [evaluated.to_metrics()])
    experiment.write_trial_json(
        "done", "result.json", {"state": "completed", "reason": "", "val_loss": 0.5}
    )
    rows = {row.trial_id: row for row in experiment.write_table()}
    assert math.isnan(rows["waiting"].val_loss)  # in memory, a loss not yet measured is NaN
    written = {
        row["trial_id"]: row for row in strict_loads((experiment.root / "trials.json").read_text())
    }
    assert written["waiting"]["val_loss"] is None and written["waiting"]["ema_fraction"] is None
    assert written["done"]["val_loss"] == 0.5 and written["done"]["state"] == "completed"
