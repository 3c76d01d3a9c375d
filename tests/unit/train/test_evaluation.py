"""The typed evaluation record and the flat metrics Tune and metrics.json hold."""

import json
import math

from schedule_search.core.states import State
from schedule_search.train.evaluation import Evaluation


def test_an_evaluation_round_trips_through_its_flat_metrics_and_json():
    point = Evaluation(
        tokens=1024,
        chinchilla=0.5,
        val_loss=2.5,
        status=State.RUNNING,
        milestone=1,
        windows=8,
        losses={0.0: 2.7, 0.04: 2.5},
        ema_fraction=0.04,
        lr=3e-3,
    )
    metrics = point.to_metrics()
    assert metrics["val_loss_raw"] == 2.7 and metrics["val_loss_ema/0.04"] == 2.5
    assert metrics["status"] == "running" and type(metrics["status"]) is str
    back = Evaluation.from_metrics(json.loads(json.dumps(metrics)))
    # NaN fields (windows not summarized) compare unequal; their JSON is the same.
    assert json.dumps(back.to_metrics()) == json.dumps(metrics)
    assert back.losses == point.losses and back.status is State.RUNNING
    assert back.loss_at(0.04) == 2.5 and math.isnan(back.loss_at(0.08))


def test_a_record_of_an_older_run_keeps_defaults_for_what_it_lacks():
    old = {"chinchilla": 1.0, "tokens": 10, "val_loss": 3.0, "val_loss_raw": 3.0, "extra": 1}
    point = Evaluation.from_metrics(old)
    assert point.status == State.RUNNING and point.losses == {0.0: 3.0}
    assert math.isnan(point.ema_fraction) and point.milestone == 0


def test_the_report_carries_every_metric_design_names():
    """DESIGN's report list: tokens, chinchilla, val_loss, val_loss_raw, val_loss_ema/<frac>,
    lr, grad_norm, tokens_per_s, window_s, microbatches (the mean window, summed over ranks)."""
    point = Evaluation(tokens=64, chinchilla=1.0, val_loss=2.0, losses={0.0: 2.1, 0.04: 2.0})
    point.window_microbatches = 6.0
    metrics = point.to_metrics()
    design = {"tokens", "chinchilla", "val_loss", "val_loss_raw", "val_loss_ema/0.04", "lr"}
    assert set(metrics) >= design | {"grad_norm", "tokens_per_s", "window_s", "microbatches"}
    assert metrics["microbatches"] == 6.0 and "window_microbatches" not in metrics
    assert Evaluation.from_metrics(metrics).window_microbatches == 6.0
