"""A transfer whose runs could not be built is refused at launch, in one line, before anything
is written or Ray is asked anything; not hours in, when the run comes up in its round."""

import json

import pytest
from helpers import one_trial_sweep

from schedule_search.cli import main
from schedule_search.core.config import ConfigError
from schedule_search.transfer.launch import plan_launch
from schedule_search.transfer.plan import METHODS
from schedule_search.transfer.run import SHARED_HELD_OUT


def test_a_wsd_branch_whose_cooldown_starts_inside_the_warmup_is_refused_at_launch(
    tmp_path, capsys
):
    # The 1 - sqrt cooldown takes the last 20% of each horizon: at the sweep's own 1x it would
    # start at 0.8x, inside this recipe's 0.85x warmup. Its run would be built only after the
    # constant run (to 8x) has ended.
    sweep = one_trial_sweep(tmp_path / "runs" / "w", warmup=0.85)
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
    sweep = one_trial_sweep(tmp_path / "runs" / "s", warmup=0.05)
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


def test_a_transfer_keeps_the_constant_lr_rule_it_was_launched_with(tmp_path):
    """A new transfer tunes constant + EMA's LR on a grid; one launched before that rule was
    recorded ran it at the recipe's LR, and resumes so (its rounds replay as planned)."""
    sweep = one_trial_sweep(tmp_path / "runs" / "s", warmup=0.05)
    assert plan_launch(sweep, [8.0], ["recipe", "constant"], None, None).constant_lr == "tuned"
    launched = sweep.root / "transfer" / "launch.json"
    launched.parent.mkdir()
    before = {"horizons": [1.0, 8.0], "to": [8.0], "methods": ["constant"], "workers": 1}
    launched.write_text(json.dumps(before))
    assert plan_launch(sweep, None, None, None, None).constant_lr == "recipe"
    launched.write_text(json.dumps(before | {"constant_lr": "tuned"}))
    assert plan_launch(sweep, None, None, None, None).constant_lr == "tuned"
    launched.write_text(json.dumps(before | {"constant_lr": "best"}))
    with pytest.raises(
        ConfigError, match=f"{launched}: constant_lr: expected one of tuned, recipe"
    ):
        plan_launch(sweep, None, None, None, None)


def test_a_recipe_file_naming_no_trial_of_the_sweep_is_refused_in_one_line(tmp_path, capsys):
    """`forecast` and `transfer` read which trial the recipe is from its `source.trial_id`; a
    recipe written by hand, or copied from another sweep, named none: a KeyError, exit 1."""
    import yaml
    from helpers import GOOD_RECIPE

    sweep = one_trial_sweep(tmp_path / "runs" / "w", warmup=0.1)
    storage = str(tmp_path / "runs")
    recipe = sweep.root / "recipe.yaml"
    for source in ({}, {"trial_id": "elsewhere"}):
        recipe.write_text(yaml.safe_dump({**GOOD_RECIPE, "source": source}))
        for verb in (["forecast", "w", "--methods", "recipe"], ["transfer", "w", "--to", "8"]):
            capsys.readouterr()
            assert main([*verb, "--storage", storage]) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1, err
            assert f"{recipe}: source.trial_id: expected a trial of" in err, err
            assert not (sweep.root / "transfer").exists(), "nothing may be written or launched"


def test_horizons_short_of_the_sweeps_are_refused_in_one_line(tmp_path, capsys):
    """A transfer to 0.5x of a 1x sweep was planned as horizons [0.5, 1] (help: "beyond the
    sweep's"); a forecast dropped 0.5 without a word."""
    sweep = one_trial_sweep(tmp_path / "runs" / "w", warmup=0.1)
    storage = str(tmp_path / "runs")
    for verb in ("transfer", "forecast"):
        assert main([verb, "w", "--storage", storage, "--to", "0.5,8"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert "--to: expected horizons at or beyond the sweep's 1x, got 0.5" in err, err
    assert not (sweep.root / "transfer").exists(), "nothing may be written or launched"


def test_a_reuse_folder_that_is_no_earlier_transfer_is_refused_in_one_line(tmp_path, capsys):
    """Refused before anything is written: a folder that is no transfer's, and a --reuse that
    would change what a launched transfer's resumed rounds copy. A resumed transfer whose
    recorded folder is gone goes on without copying (said once)."""
    sweep = one_trial_sweep(tmp_path / "runs" / "r", warmup=0.05)
    storage = str(tmp_path / "runs")
    own = sweep.root / "transfer"
    transfer = ["transfer", "r", "--to", "8", "--storage", storage]
    for folder, why in (
        (tmp_path / "nowhere", "expected the folder of an earlier transfer"),
        (tmp_path / "elsewhere", f"{own} was launched without --reuse; a resumed round copies"),
    ):
        if why.startswith(str(own)):  # a transfer launched here before
            (own / "round1" / "trials").mkdir(parents=True)
            launched = {"horizons": [1.0, 8.0], "to": [8.0], "methods": list(METHODS)}
            launched["workers"] = sweep.settings().workers
            (own / "launch.json").write_text(json.dumps(launched))
        capsys.readouterr()
        assert main([*transfer, "--reuse", str(folder)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--reuse {folder.resolve()}" in err and why in err, err
    assert sorted(p.name for p in own.iterdir()) == ["launch.json", "round1"]  # nothing written
    launched["reuse"] = str(tmp_path / "gone")
    (own / "launch.json").write_text(json.dumps(launched))
    assert plan_launch(sweep, None, None, None, None).reuse is None
    assert f"note: {tmp_path / 'gone'} (--reuse) is gone" in capsys.readouterr().out
