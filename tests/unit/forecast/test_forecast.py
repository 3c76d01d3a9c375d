"""The forecast's law and verb on real record files: the fit recovers the law that generated
the curves, a horizon-free run's forecast knows no horizon, the recipe is continued along its
own curve where it has one, and too few curves are refused in one line."""

import json
from dataclasses import replace

import numpy as np
import pytest
from helpers import strict_loads

from schedule_search.cli import main
from schedule_search.core.schedules import ScheduleConfig
from schedule_search.forecast import LossLaw, Run, fit_law
from schedule_search.forecast.law import Curve, with_schedule
from schedule_search.forecast.own_curve import (
    PowerCurve,
    continue_curve,
    fit_power_curve,
    past_warmup,
)
from schedule_search.store.experiment import Experiment, SweepSettings
from schedule_search.store.facts import SweepFacts, write_facts
from schedule_search.train.evaluation import Evaluation

TRUTH = LossLaw(l0=0.9, a=0.05, alpha=0.6, d=8.0, nu=0.5, tau=0.3, p=0.4, q=0.9)
EVAL_AT = [0.5, 1.0, 2.0, 4.0]


def sweep_like_runs() -> list[Run]:
    """AdamW runs as a sweep draws them: three LRs, constant and two poly decays, 1 or 3
    micro-batches per step."""
    shapes = [("constant", 0.5, 4.0), ("poly", 0.5, 1.0), ("poly", 1.0, 0.5)]
    return [
        Run(lr, ScheduleConfig(kind=kind, gamma=gamma, alpha=alpha), microbatches)
        for lr in (3e-3, 1e-2, 3e-2)
        for kind, gamma, alpha in shapes
        for microbatches in (1, 3)
    ]


def test_the_fit_recovers_the_law_that_made_the_curves():
    curves = [
        Curve(run, dict(zip(EVAL_AT, TRUTH.predict(run, EVAL_AT), strict=True)))
        for run in sweep_like_runs()
    ]
    law = fit_law(curves)
    for name in ("l0", "a", "alpha", "d", "nu", "tau", "p", "q"):
        assert getattr(law, name) == pytest.approx(getattr(TRUTH, name), rel=1e-4), name
    far = Run(5e-3, ScheduleConfig(kind="cosine", horizon=32.0), 2)  # a run it never saw
    assert law.predict(far, [32.0]) == pytest.approx(TRUTH.predict(far, [32.0]), abs=1e-6)


def test_a_horizon_free_forecast_needs_no_horizon():
    # A constant or poly schedule has no field for a horizon: its loss at 8x is the same
    # whether one asks up to 8x or up to 32x.
    for kind in ("constant", "poly"):
        run = Run(1e-2, ScheduleConfig(kind=kind), 1)
        alone = TRUTH.predict(run, [8.0])[0]
        assert TRUTH.predict(run, [8.0, 16.0, 32.0])[0] == pytest.approx(alone, abs=1e-12)
    # ... while a cosine's loss at 8x depends on where it ends (the check can fail).
    ends = [
        TRUTH.predict(Run(1e-2, ScheduleConfig(kind="cosine", horizon=h), 1), [8.0])[0]
        for h in (8.0, 32.0)
    ]
    assert abs(ends[0] - ends[1]) > 1e-3


def write_sweep(
    root, runs: list[Run], at: list[float], optimizers: dict[int, str] | None = None
) -> Experiment:
    """A finished sweep's folder of `runs` whose records hold the law's losses at `at`, each
    trained with AdamW or the optimizer `optimizers` names for its index."""
    experiment = Experiment(root)
    root.mkdir(parents=True)
    experiment.save_settings(
        SweepSettings(name=root.name, samples=len(runs), workers=1, concurrency=1)
    )
    write_facts(
        root,
        SweepFacts(
            horizon=max(at),
            milestones=at,
            tokens_per_param=20.0,
            n_params=1000,
            tokens_per_reference_step=16.0,
        ),
    )
    for number, run in enumerate(runs):
        trial_id = f"t{number:04d}"
        schedule = {
            "kind": run.schedule.kind,
            "gamma": run.schedule.gamma,
            "alpha": run.schedule.alpha,
            "warmup": run.schedule.warmup,
        }
        config = {
            "optimizer": {"name": (optimizers or {}).get(number, "adamw"), "lr": run.lr},
            "schedule": schedule,
            "window": {"microbatches": run.microbatches},
        }
        experiment.write_trial_json(trial_id, "config.json", {"params": {}, "config": config})
        losses = TRUTH.predict(run, at)
        history = [
            Evaluation(
                tokens=int(t * 20_000),
                chinchilla=t,
                val_loss=float(loss) - 0.01,
                milestone=i + 1,
                losses={0.0: float(loss), 0.04: float(loss) - 0.01},
            ).to_metrics()
            for i, (t, loss) in enumerate(zip(at, losses, strict=True))
        ]
        experiment.write_trial_json(trial_id, "metrics.json", history)
        experiment.write_trial_json(
            trial_id,
            "result.json",
            {"state": "completed", "reason": "", "val_loss": history[-1]["val_loss"]},
        )
    return experiment


def test_the_verb_forecasts_from_the_records_and_writes_its_table(tmp_path, capsys):
    # Three evaluations a trial: too few for the recipe's own curve, so the law forecasts it.
    experiment = write_sweep(tmp_path / "runs" / "lf", sweep_like_runs(), [1.0, 2.0, 4.0])
    assert main(["forecast", "lf", "--storage", str(tmp_path / "runs"), "--to", "8,32"]) == 0
    document = strict_loads((experiment.root / "forecast" / "forecast.json").read_text())
    assert document["horizons"] == [4.0, 8.0, 32.0]
    assert (experiment.root / "forecast" / "forecast.png").read_bytes()[:4] == b"\x89PNG"
    assert set(document["interval"]) == {"law"}
    # The recipe is the best trial at 4x; its raw-weights law is TRUTH, its objective 0.01
    # below: the forecast of the recipe continued is the law's at each horizon, exactly.
    best = experiment.best(4.0)
    config = experiment.read_trial_json(best.trial_id, "config.json")["config"]
    recipe = Run(
        config["optimizer"]["lr"],
        ScheduleConfig(**config["schedule"]),
        config["window"]["microbatches"],
    )
    for horizon in (8.0, 32.0):
        cell = document["rows"]["recipe (best EMA)"][f"{horizon:g}"]
        expected = TRUTH.predict(recipe, [horizon])[0] - 0.01
        assert cell["loss"] == pytest.approx(expected, abs=1e-4)
        assert cell["low"] <= cell["loss"] <= cell["high"] and cell["basis"] == "law"
        envelope = document["rows"]["cosine envelope (last iterate)"][f"{horizon:g}"]
        lrs = np.geomspace(3e-3 / 4, 3e-2 * 4, 61)
        cosine = ScheduleConfig(kind="cosine", horizon=horizon, warmup=recipe.schedule.warmup)
        truth = min(TRUTH.predict(Run(lr, cosine, recipe.microbatches), [horizon])[0] for lr in lrs)
        assert envelope["loss"] == pytest.approx(truth, abs=1e-4)
    # Past 8x, linear to zero's best LR under TRUTH (5.2e-2 at 32x, computed as above) lies
    # above the swept 3e-3-3e-2: such a cell says it is the law extrapolated in LR; cosine's
    # (7.4e-3 to 1.6e-2) does not.
    for horizon in (8.0, 32.0):
        linear = document["rows"]["linear-to-zero envelope (last iterate)"][f"{horizon:g}"]
        assert linear["lr"] > 3e-2 and "outside the fitted LRs 0.003-0.03" in linear["caution"]
    cosine_rows = document["rows"]["cosine envelope (last iterate)"].values()
    assert not any(cell["caution"] for cell in cosine_rows)
    out = capsys.readouterr().out
    assert "caution: linear-to-zero envelope (last iterate) at 32x: best LR" in out
    assert "recipe (best EMA)" in out
    # each law's fit on its own curves: these are the law's own, so it fits them closely
    fits = [line for line in out.splitlines() if line.startswith("law ")]
    assert {line.split(":")[0] for line in fits} == {f"law {name}" for name in document["laws"]}
    assert all(float(line.split("rmse ")[1].split()[0]) < 1e-3 for line in fits), fits


def test_the_recipe_is_forecast_along_its_own_curve(tmp_path, capsys):
    """A recipe trial with four evaluations past its warmup is forecast by its own curve
    continued: exactly where that curve is a power law with a floor, with an interval that
    opens when one evaluation strays from it. The law is not fitted for it (16 schedule-free
    evaluations are not needed)."""
    runs = sweep_like_runs()
    schedule_free = {0: "schedulefree_adamw"}
    experiment = write_sweep(tmp_path / "runs" / "own", runs, EVAL_AT, schedule_free)
    curve = PowerCurve(floor=0.5, scale=0.3, exponent=0.7)  # below every other trial at 4x
    losses = dict(zip(EVAL_AT, curve.predict(EVAL_AT), strict=True))
    for stray in (0.0, 0.01):
        rewrite_objective(experiment, "t0000", {**losses, 2.0: losses[2.0] + stray})
        code = main(["forecast", "own", "--storage", str(tmp_path / "runs"), "--to", "8,32"])
        assert code == 0
        document = strict_loads((experiment.root / "forecast" / "forecast.json").read_text())
        assert document["recipe_trial"] == "t0000"
        assert set(document["interval"]) == {"law", "own curve"}
        assert "schedulefree_adamw/objective" not in document["laws"]
        for horizon in (8.0, 32.0):
            cell = document["rows"]["recipe (best EMA)"][f"{horizon:g}"]
            assert cell["basis"] == "own curve"
            assert cell["low"] <= cell["loss"] <= cell["high"]
            if stray == 0.0:
                assert cell["loss"] == pytest.approx(curve.predict([horizon])[0], abs=1e-6)
                assert cell["high"] - cell["low"] < 1e-6
            else:
                assert cell["high"] - cell["low"] > 1e-3
    assert "by the own curve: recipe (best EMA); interval" in capsys.readouterr().out


def test_the_power_curve_fit_recovers_its_parameters():
    truth = PowerCurve(floor=1.02, scale=0.445, exponent=0.75)
    ages = [0.5, 1.0, 2.0, 4.0]
    fitted = fit_power_curve(dict(zip(ages, truth.predict(ages), strict=True)))
    for name in ("floor", "scale", "exponent"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-5), name
    with pytest.raises(ValueError, match="a curve needs 4"):
        continue_curve(dict(zip(ages[:3], truth.predict(ages[:3]), strict=True)), 8.0)
    # Evaluations during the warmup are left out (the LR still rises there), and so are losses
    # that are not finite.
    assert past_warmup({0.25: 2.0, 0.5: 1.8, 1.0: float("nan"), 2.0: 1.2}, 0.4) == {
        0.5: 1.8,
        2.0: 1.2,
    }


def rewrite_objective(experiment: Experiment, trial_id: str, losses: dict[float, float]) -> None:
    """Set the objective (best EMA) of `trial_id`'s evaluations to `losses`."""
    history = experiment.read_trial_json(trial_id, "metrics.json")
    for row in history:
        row["val_loss"] = losses[row["chinchilla"]]
    experiment.write_trial_json(trial_id, "metrics.json", history)
    result = experiment.read_trial_json(trial_id, "result.json")
    experiment.write_trial_json(trial_id, "result.json", {**result, "val_loss": losses[4.0]})


def constant_forecast_lr(experiment: Experiment, launched: dict | None) -> float:
    """The LR `forecast` puts constant + EMA at (to 8x), the sweep's transfer launched as
    `launched` (None: no transfer yet)."""
    if launched is not None:
        (experiment.root / "transfer").mkdir(exist_ok=True)
        (experiment.root / "transfer" / "launch.json").write_text(json.dumps(launched))
    storage = str(experiment.root.parent)
    assert main(["forecast", experiment.root.name, "--storage", storage, "--to", "8"]) == 0
    document = strict_loads((experiment.root / "forecast" / "forecast.json").read_text())
    return document["rows"]["constant + EMA (best EMA)"]["8"]["lr"]


def test_constant_ema_is_forecast_at_the_lr_the_transfer_trains_it_at(tmp_path):
    """Constant + EMA trains with AdamW around the recipe's AdamW LR (a schedule-free
    recipe's over sqrt(10), `TransferStudy.adamw_lr`): a transfer launched now at the LR of
    its grid (x0.5-x2, extended to x1/8-x8) best at the sweep's horizon, one launched before
    that rule at the recipe's AdamW LR itself. Its forecast is at the LR its transfer trains,
    or its error beside the measured cell would compare two runs."""
    runs = sweep_like_runs()
    best = int(np.argmin([TRUTH.predict(run, [4.0])[0] for run in runs]))
    recipe_lr = runs[best].lr  # 1e-2, the exported trial's
    # AdamW's constant + EMA is best near a quarter of the recipe's LR by the law that made
    # the curves: the grid, extended, would get there.
    constant = with_schedule(runs[best], kind="constant")
    lattice = [recipe_lr * f for f in (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)]
    truth = [TRUTH.predict(replace(constant, lr=lr), [4.0])[0] for lr in lattice]
    assert int(np.argmin(truth)) == 1
    adamw = write_sweep(tmp_path / "runs" / "aw", runs, EVAL_AT)
    assert constant_forecast_lr(adamw, None) == pytest.approx(recipe_lr / 4)
    assert constant_forecast_lr(adamw, {"constant_lr": "tuned"}) == pytest.approx(recipe_lr / 4)
    assert constant_forecast_lr(adamw, {"seeds": 3}) == pytest.approx(recipe_lr)  # before
    schedule_free = {best, *[i for i in range(len(runs)) if i != best][:3]}  # 16 evaluations
    optimizers = dict.fromkeys(schedule_free, "schedulefree_adamw")
    free = write_sweep(tmp_path / "runs" / "sf", runs, EVAL_AT, optimizers)
    assert constant_forecast_lr(free, {"seeds": 3}) == pytest.approx(recipe_lr / np.sqrt(10.0))


def test_too_few_curves_are_refused_in_one_line(tmp_path, capsys):
    runs = sweep_like_runs()[:2]
    experiment = write_sweep(tmp_path / "runs" / "few", runs, EVAL_AT)
    assert main(["forecast", "few", "--storage", str(tmp_path / "runs")]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1
    assert "8 evaluation(s) of 2 trial(s); the law needs 16 of at least 3 trials" in error[0]
    assert not (experiment.root / "forecast").exists()  # nothing written


def test_the_recipe_alone_is_forecast_where_the_laws_lack_curves(tmp_path, capsys):
    """A sweep whose AdamW trials are too few for a law (a default `make sweep`: ASHA stops
    most of them early) still holds the recipe's own curve: the refusal says how to ask for
    that row alone, and `--methods recipe` forecasts it without fitting any law."""
    runs = sweep_like_runs()[:2]
    experiment = write_sweep(tmp_path / "runs" / "few", runs, EVAL_AT)
    storage = ["--storage", str(tmp_path / "runs")]
    assert main(["forecast", "few", *storage]) == 2
    assert "`--methods recipe` forecasts the recipe alone" in capsys.readouterr().err
    assert main(["forecast", "few", *storage, "--methods", "recipe", "--to", "8"]) == 0
    document = strict_loads((experiment.root / "forecast" / "forecast.json").read_text())
    assert list(document["rows"]) == ["recipe (best EMA)"] and document["laws"] == {}
    cell = document["rows"]["recipe (best EMA)"]["8"]
    assert cell["basis"] == "own curve" and cell["low"] <= cell["loss"] <= cell["high"]
    # The objective curve is the law's minus 0.01 at every evaluation: nearly a power law,
    # continued to about where the law goes.
    best = min(runs, key=lambda run: TRUTH.predict(run, [4.0])[0])
    assert cell["loss"] == pytest.approx(TRUTH.predict(best, [8.0])[0] - 0.01, abs=0.02)
    # With three evaluations the recipe has no own curve: no hint, the law's refusal alone.
    short = write_sweep(tmp_path / "runs" / "short", runs[:2], [1.0, 2.0, 4.0])
    assert main(["forecast", "short", *storage, "--methods", "recipe"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "--methods recipe" not in error[0], error
    assert "the law needs 16 of at least 3 trials" in error[0]
    assert not (short.root / "forecast").exists()


def test_forecast_methods_outside_the_rows_are_refused_in_one_line(tmp_path, capsys):
    experiment = write_sweep(tmp_path / "runs" / "m", sweep_like_runs()[:2], EVAL_AT)
    code = main(["forecast", "m", "--storage", str(tmp_path / "runs"), "--methods", "wsd"])
    assert code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "recipe,constant,cosine,linear" in error[0], error
    assert not (experiment.root / "forecast").exists()


def test_export_at_a_longer_horizon_picks_by_each_trials_own_curve(tmp_path, capsys):
    """The trial best at the sweep's horizon (a fast start, a high floor) is not the one whose
    own curve is lowest at 32x (a slow start, a low floor); `export --at 32` picks the latter
    and writes its forecast into the recipe. A cosine trial, lowest of all at 4x, ends there:
    it has no curve to continue and is never picked by it."""
    import yaml

    from schedule_search.recipe import load_recipe

    runs = sweep_like_runs()[:3]
    runs[2] = Run(1e-2, ScheduleConfig(kind="cosine", horizon=4.0), 1)
    experiment = write_sweep(tmp_path / "runs" / "at", runs, EVAL_AT)
    cosine = experiment.read_trial_json("t0002", "config.json")
    cosine["config"]["schedule"]["horizon"] = 4.0
    experiment.write_trial_json("t0002", "config.json", cosine)
    fast, slow = PowerCurve(0.70, 0.40, 1.5), PowerCurve(0.40, 0.60, 0.3)
    curves = {"t0000": fast, "t0001": slow, "t0002": PowerCurve(0.40, 0.40, 1.5)}
    for trial_id, curve in curves.items():
        rewrite_objective(
            experiment, trial_id, dict(zip(EVAL_AT, curve.predict(EVAL_AT), strict=True))
        )
        history = experiment.read_trial_json(trial_id, "metrics.json")
        for row in history:  # what a trial records and a recipe needs: its model, its EMA
            row.update(n_params=1000, tokens_per_reference_step=16, ema_fraction=0.04)
            row["val_loss_ema/0.04"] = row["val_loss"]
        experiment.write_trial_json(trial_id, "metrics.json", history)
    assert fast.predict([4.0])[0] < slow.predict([4.0])[0]
    assert fast.predict([32.0])[0] > slow.predict([32.0])[0]
    storage = ["--storage", str(tmp_path / "runs")]
    recipe = experiment.root / "recipe.yaml"

    assert main(["export", "at", *storage]) == 0
    assert yaml.safe_load(recipe.read_text())["source"]["trial_id"] == "t0002"
    assert main(["export", "at", *storage, "--at", "32"]) == 0
    written = yaml.safe_load(recipe.read_text())
    assert written["source"]["trial_id"] == "t0001"
    forecast = written["objective"]["forecast"]
    assert forecast["horizon"] == 32.0 and forecast["trial_id"] == "t0001"
    assert forecast["loss"] == pytest.approx(slow.predict([32.0])[0], abs=1e-6)
    assert "forecast" in written["objective"]["rule"]
    assert load_recipe(recipe).spec.source["trial_id"] == "t0001"  # as the transfer reads it
    out = capsys.readouterr().out
    assert "trial t0001: forecast val_loss" in out and "best at 4x: trial t0002" in out, out

    # --within: only the trials the sweep's horizon cannot tell from its best are ranked.
    best = curves["t0002"].predict([4.0])[0]
    behind = {t: curves[t].predict([4.0])[0] - best for t in ("t0000", "t0001")}
    for within, picked in (
        ((behind["t0000"] + behind["t0001"]) / 2, "t0000"),
        (
            behind["t0001"] + 1e-3,
            "t0001",
        ),
    ):
        assert main(["export", "at", *storage, "--at", "32", "--within", f"{within:.6f}"]) == 0
        written = yaml.safe_load(recipe.read_text())
        assert written["source"]["trial_id"] == picked, within
        assert written["objective"]["forecast"]["within"] == pytest.approx(within, abs=1e-6)
        assert f"within {within:.6f}".rstrip("0") in written["objective"]["rule"]

    for flags, message in [
        (["--at", "2"], "--at: expected horizons at or beyond the sweep's 4x, got 2"),
        (["--at", "32", "--max-slowdown", "2"], "--at: picks by the forecast loss alone"),
        (["--within", "0.01"], "--within: narrows the trials --at ranks by forecast; add --at"),
        (["--at", "32", "--within", "0"], "--within 0: no horizon-free trial with a curve"),
    ]:
        recipe.unlink(missing_ok=True)
        assert main(["export", "at", *storage, *flags]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
        assert not recipe.exists()
    short = write_sweep(tmp_path / "runs" / "short", runs[:2], [1.0, 2.0, 4.0])
    assert main(["export", "short", *storage, "--at", "32"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "4 evaluations past its warmup" in err, err
    assert not (short.root / "recipe.yaml").exists()
