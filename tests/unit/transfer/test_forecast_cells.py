"""The sweep's forecast beside the transfer's measured cells: each forecast row is matched to
the row it predicts, its error is forecast minus measured, and a forecast of another recipe
(or none) leaves the table as it is."""

import json
import math

import pytest
from test_transfer_plan import BASE, history

from schedule_search.report.forecast_cells import forecast_cells, forecast_markdown, read_forecast
from schedule_search.report.transfer import transfer_table, write_transfer_report
from schedule_search.transfer.plan import TransferStudy
from schedule_search.transfer.run import RunRecord


def cell(loss: float) -> dict:
    return {"loss": loss, "low": loss - 0.01, "high": loss + 0.02, "lr": 0.1}


FORECAST = {
    "recipe_trial": "t1",
    "horizons": [1.0, 2.0],
    "rows": {
        "recipe (best EMA)": {"1": cell(0.95), "2": cell(0.90)},
        "constant + EMA (best EMA)": {"1": cell(1.02)},
        "cosine envelope (last iterate)": {"1": cell(1.01), "2": cell(0.93)},
    },
}


def test_each_forecast_stands_beside_the_row_it_predicts_with_its_error():
    s = TransferStudy(BASE, [1.0, 2.0], ["recipe", "constant", "cosine"], 1.0, constant_lr="recipe")
    runs = {
        "recipe": history((1.0, 0.97), (2.0, 0.91), key="val_loss_ema/0.04"),
        "constant": history((1.0, 1.05), (2.0, 1.00)),
    }
    for h in (1.0, 2.0):
        for lr, loss in ((0.05, 1.3), (0.1, 1.0), (0.2, 1.4)):
            runs[f"cosine-{h:g}x-lr{lr:g}"] = history((h, loss - 0.05 * (h - 1)))
    table = transfer_table(s, runs)
    cells = forecast_cells(FORECAST, table)
    recipe = cells["recipe (best EMA)"]
    assert recipe["1"]["measured"] == pytest.approx(0.97)
    assert recipe["1"]["error"] == pytest.approx(-0.02) and recipe["2"]["error"] == pytest.approx(
        -0.01
    )
    assert cells["constant + EMA (best EMA)"]["1"]["error"] == pytest.approx(1.02 - 1.05)
    assert "2" not in cells["constant + EMA (best EMA)"]  # not forecast there: no cell
    assert cells["cosine envelope (last iterate)"]["2"]["measured"] == pytest.approx(0.95)
    text = forecast_markdown(cells, s.horizons)
    line = next(row for row in text.splitlines() if row.startswith("| recipe (best EMA)"))
    assert "0.9500 [0.9400, 0.9700] (0.9700, -0.0200)" in line, line
    constant = next(row for row in text.splitlines() if row.startswith("| constant"))
    assert constant.endswith("| - |"), constant


def test_a_forecast_is_read_only_for_the_recipe_it_was_made_for(tmp_path):
    assert read_forecast(tmp_path, "t1") is None  # none made
    (tmp_path / "forecast").mkdir()
    (tmp_path / "forecast" / "forecast.json").write_text(json.dumps(FORECAST))
    assert read_forecast(tmp_path, "t1") == FORECAST
    assert read_forecast(tmp_path, "another") is None
    (tmp_path / "forecast" / "forecast.json").write_text('{"recipe_trial": "t1", ')
    assert read_forecast(tmp_path, "t1") is None  # cut short: the table goes without it
    for misshapen in ({"rows": []}, {"rows": {"recipe (best EMA)": {"1": {"loss": 1.0}}}}):
        (tmp_path / "forecast" / "forecast.json").write_text(
            json.dumps({"recipe_trial": "t1"} | misshapen)
        )
        assert read_forecast(tmp_path, "t1") is None, misshapen
    assert read_forecast(tmp_path, None) is None  # no launch record: no recipe to match


def test_the_transfer_report_shows_the_forecast_of_its_own_recipe_only(tmp_path):
    s = TransferStudy(BASE, [1.0, 2.0], ["recipe", "constant", "cosine"], 1.0, constant_lr="recipe")
    configs = {"recipe": s.recipe(), "constant": s.trunk(s.adamw_lr, s.top)}
    runs = {
        "recipe": history((1.0, 0.97), (2.0, 0.91), key="val_loss_ema/0.04"),
        "constant": history((1.0, 1.05), (2.0, 1.00)),
    }
    for h in (1.0, 2.0):
        spec = s.grid("cosine", h, runs)
        for lr, loss in zip(spec.start, (1.3, 1.0, 1.4), strict=True):
            runs[spec.run_name(lr)] = history((h, loss))
            configs[spec.run_name(lr)] = s.grid_run(spec, lr)
    records = {name: RunRecord(runs[name], configs[name], f"round1/{name}") for name in runs}
    sweep = tmp_path / "lt"
    root = sweep / "transfer"
    root.mkdir(parents=True)
    (root / "launch.json").write_text(json.dumps({"recipe_trial": "t1"}))
    (sweep / "forecast").mkdir()
    for trial, shown in (("t1", True), ("another", False)):
        (sweep / "forecast" / "forecast.json").write_text(
            json.dumps(FORECAST | {"recipe_trial": trial})
        )
        table = write_transfer_report(root, s, records, [])
        text = (root / "transfer.md").read_text()
        assert ("## The sweep's forecast beside the measured cells" in text) is shown, trial
        assert ("forecast" in json.loads((root / "transfer.json").read_text())) is shown
        assert ("forecast" in table) is shown
        # The recipe's measured 1x cell beside its forecast, with the error.
        assert ("0.9500 [0.9400, 0.9700] (0.9700, -0.0200)" in text) is shown


def test_a_forecast_number_written_as_null_reads_back_as_nan(tmp_path):
    """forecast.json is strict JSON (a number that was not finite is null): read back, such a
    cell is a forecast like any other, with NaN where its number was."""
    (tmp_path / "forecast").mkdir()
    document = json.loads(json.dumps(FORECAST))
    document["rows"]["recipe (best EMA)"]["2"]["low"] = None
    (tmp_path / "forecast" / "forecast.json").write_text(json.dumps(document))
    read = read_forecast(tmp_path, "t1")
    assert read is not None and math.isnan(read["rows"]["recipe (best EMA)"]["2"]["low"])
    assert read["rows"]["recipe (best EMA)"]["2"]["loss"] == 0.90
