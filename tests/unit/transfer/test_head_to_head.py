"""The recipe against each other row of a transfer, paired by seed: the differences, their
Student-t interval (checked against scipy's), and who diverged alone."""

import math

import pytest
from scipy import stats
from test_transfer_plan import BASE, history

from schedule_search.report.head_to_head import head_to_head_markdown
from schedule_search.report.transfer import transfer_table
from schedule_search.transfer.plan import TransferStudy
from schedule_search.transfer.seeds import seeded

STUDY = TransferStudy(BASE, [1.0], ["recipe", "constant", "cosine"], 1.0, constant_lr="recipe")


def table(recipe: list[float], constant: list[float]) -> dict:
    """A 3-seed study at 1x: the recipe's and constant + EMA's loss on each seed (inf: that
    run diverged), beside a cosine envelope that neither diverges nor ties."""
    runs = {f"cosine-1x-lr{lr:g}": history((1.0, loss)) for lr, loss in ((0.05, 1.3), (0.2, 1.4))}
    for seed in range(3):
        runs[seeded("cosine-1x-lr0.1", seed)] = history((1.0, 1.2 + 0.03 * seed))
        runs[seeded("recipe", seed)] = history((1.0, recipe[seed]), key="val_loss_ema/0.04")
        runs[seeded("constant", seed)] = history((1.0, constant[seed]))
    return transfer_table(STUDY, runs)


def constant_cell(result: dict) -> dict:
    return result["head_to_head"]["rows"]["constant + EMA (best of bank)"]["1"]


def test_each_difference_is_the_recipe_minus_the_row_seed_by_seed():
    recipe, constant = [1.00, 1.10, 0.95], [1.021, 1.12, 0.969]
    cell = constant_cell(table(recipe, constant))
    differences = [a - b for a, b in zip(recipe, constant, strict=True)]
    half = stats.t.ppf(0.975, 2) * stats.sem(differences)
    assert cell["gap"] == pytest.approx(sum(differences) / 3)
    assert cell["half_width"] == pytest.approx(half) and cell["n"] == 3
    assert cell["verdict"] == "better"  # -0.0200 ± 0.0025: the interval excludes 0


def test_a_difference_inside_the_seeds_noise_is_called_neither_way():
    cell = constant_cell(table([1.00, 1.10, 0.95], [1.03, 1.08, 0.97]))
    assert cell["verdict"] == "within noise"


def test_where_the_recipe_diverged_alone_it_reads_worse():
    cell = constant_cell(table([1.00, math.inf, 0.95], [1.02, 1.11, 0.98]))
    assert cell["recipe_diverged"] == 1 and cell["n"] == 2
    assert cell["verdict"] == "worse: diverged on 1 seed"


def test_where_the_row_diverged_alone_its_pair_is_left_out_and_said():
    result = table([1.00, 1.10, 0.95], [1.02, math.inf, 0.98])
    cell = constant_cell(result)
    assert cell["row_diverged"] == 1 and cell["n"] == 2 and cell["gap"] == pytest.approx(-0.025)
    line = next(
        row for row in head_to_head_markdown(result).splitlines() if row.startswith("| constant")
    )
    assert "-0.0250 ± " in line and "[2 pairs, the row diverged on 1]" in line, line


def test_every_row_with_replicas_but_the_recipe_is_compared():
    result = table([1.00, 1.10, 0.95], [1.02, 1.11, 0.98])
    assert result["head_to_head"]["recipe"].startswith("recipe")
    compared = set(result["head_to_head"]["rows"])
    assert "constant + EMA (best of bank)" in compared
    assert not any(label.startswith("recipe") for label in compared)
    envelope = next(label for label in compared if label.startswith("envelope"))
    # Against the envelope it is the seeds table's gap, read from the recipe's side.
    recipe_row = next(r for label, r in result["rows"].items() if label.startswith("recipe"))
    cell = result["head_to_head"]["rows"][envelope]["1"]
    assert cell["gap"] == pytest.approx(recipe_row["seeds"]["1"]["gap"])


def test_one_seed_has_no_head_to_head():
    runs = {"recipe": history((1.0, 1.0), key="val_loss_ema/0.04"), "constant": history((1.0, 1.1))}
    result = transfer_table(STUDY, runs)
    assert result["head_to_head"] == {} and head_to_head_markdown(result) == ""


def test_rows_that_read_the_same_runs_are_one_comparison_in_the_count():
    """Cosine is the only envelope kind here: the cosine envelope, the cosine tuned for 1x and
    the envelope read one run, so with constant + EMA the recipe faces 2 distinct rows."""
    result = table([1.00, 1.10, 0.95], [1.02, 1.11, 0.98])
    rows = result["head_to_head"]["rows"]
    assert len(rows) >= 3
    assert "2 distinct differences are judged" in head_to_head_markdown(result)
