"""A transfer whose runs could not be built is refused at launch, in one line, before anything
is written or Ray is asked anything; not hours in, when the run comes up in its round."""

import json

from schedule_search.cli import main
from schedule_search.store.experiment import Experiment, SweepSettings
from schedule_search.store.facts import SweepFacts, write_facts
from schedule_search.train.evaluation import Evaluation
from schedule_search.transfer.launch import plan_launch
from schedule_search.transfer.run import SHARED_HELD_OUT


def finished_sweep(root, warmup: float) -> Experiment:
    """A sweep to 1x of one completed linreg trial whose LR warms up over `warmup`x."""
    sweep = Experiment(root)
    root.mkdir(parents=True)
    sweep.save_settings(SweepSettings(name=root.name, samples=1, workers=1, concurrency=1))
    write_facts(root, SweepFacts(1.0, [0.5, 1.0], 20.0, 64, 16.0))
    config = {
        "task": {"name": "linreg", "dim": 64, "batch": 16},
        "optimizer": {"name": "sgd", "lr": 0.1},
        "schedule": {"kind": "poly", "warmup": warmup, "alpha": 4.0},
        "budget": {"horizon": 1.0, "eval_at": [0.5]},
    }
    sweep.write_trial_json("t0", "config.json", {"params": {}, "config": config})
    history = [
        Evaluation(
            tokens=int(t * 1280),
            chinchilla=t,
            val_loss=v,
            milestone=m,
            ema_fraction=0.0,
            losses={0.0: v},
        )
        for m, (t, v) in enumerate([(0.5, 2.0), (1.0, 1.5)], start=1)
    ]
    sweep.write_trial_json("t0", "metrics.json", [e.to_metrics() for e in history])
    sweep.write_trial_json(
        "t0", "result.json", {"state": "completed", "reason": "", "val_loss": 1.5}
    )
    return sweep


def test_a_wsd_branch_whose_cooldown_starts_inside_the_warmup_is_refused_at_launch(
    tmp_path, capsys
):
    # The 1 - sqrt cooldown takes the last 20% of each horizon: at the sweep's own 1x it would
    # start at 0.8x, inside this recipe's 0.85x warmup. Its run would be built only after the
    # constant run (to 8x) has ended.
    sweep = finished_sweep(tmp_path / "runs" / "w", warmup=0.85)
    args = ["transfer", "w", "--storage", str(tmp_path / "runs"), "--to", "8"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "transfer run wsd-sqrt-1x: schedule.decay_fraction: 0.2 of horizon 1 starts the " in err
    assert "inside the warmup (0.85)" in err
    assert not (sweep.root / "transfer").exists(), "nothing may be written or launched"
    # Without the WSD rows the same recipe's transfer is planned (the plan alone: no Ray).
    launch = plan_launch(sweep, [8.0], ["recipe", "constant"], None, None)
    assert launch.horizons == [1.0, 8.0] and not launch.resume


def test_a_transfer_of_seeds_launched_before_the_shared_held_out_sample_is_not_resumed(
    tmp_path, capsys
):
    """Its replicas were scored each on its seed's own held-out sample; runs made now share
    one: resuming it would put the two in one table. Refused in one line, nothing written; the
    same launch made now (marked) resumes."""
    sweep = finished_sweep(tmp_path / "runs" / "s", warmup=0.05)
    launched = sweep.root / "transfer" / "launch.json"
    launched.parent.mkdir()
    before = {
        "horizons": [1.0, 8.0],
        "to": [8.0],
        "methods": ["recipe", "constant"],
        "workers": 1,
        "concurrency": 1,
        "seeds": 3,
    }
    launched.write_text(json.dumps(before))
    args = ["transfer", "s", "--storage", str(tmp_path / "runs")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{launched.parent}: a transfer of 3 seeds" in err, err
    assert "Move that folder aside" in err
    assert sorted(p.name for p in launched.parent.iterdir()) == ["launch.json"]
    launched.write_text(json.dumps(before | {"seeds": 1}))  # seed 0 alone: nothing to mix
    assert plan_launch(sweep, None, None, None, None).resume
    launched.write_text(json.dumps(before | {"held_out": SHARED_HELD_OUT}))
    launch = plan_launch(sweep, None, None, None, None)
    assert launch.resume and launch.seeds == 3
