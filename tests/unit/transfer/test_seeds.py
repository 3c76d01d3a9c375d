"""Seeds in the transfer: which replicas a study of K seeds trains and when, and the table over
seeds (means, Student-t intervals checked against scipy's own, gaps paired seed by seed, and a
gap worded better or worse only where its interval excludes 0)."""

import math
from pathlib import Path

import pytest
from helpers import strict_loads
from scipy import stats
from test_transfer_plan import ALL, BASE, history

from schedule_search.report.figures import plt
from schedule_search.report.seeds import interval, seeds_markdown, verdict
from schedule_search.report.transfer import ENVELOPE_ROW, transfer_table, write_transfer_report
from schedule_search.report.transfer_figures import gap_figure
from schedule_search.train.evaluation import Evaluation
from schedule_search.transfer.plan import TransferStudy
from schedule_search.transfer.run import RunRecord
from schedule_search.transfer.seeds import pending_with_seeds, seed_of, seeded


def study(methods=ALL, constant_lr="tuned") -> TransferStudy:
    return TransferStudy(
        BASE, [1.0, 2.0], methods, 1.0, "/sweep/checkpoint_1", constant_lr=constant_lr
    )


def checkpoints(asked):
    def checkpoint_at(run, multiple):
        asked.append((run, round(multiple, 6)))
        return Path(f"/ckpt/{run}/{multiple:g}")

    return checkpoint_at


def test_names_of_replicas():
    assert seeded("cosine-8x-lr0.0079", 0) == "cosine-8x-lr0.0079"
    assert seeded("cosine-8x-lr0.0079", 2) == "cosine-8x-lr0.0079@seed2"
    assert seed_of("cosine-8x-lr0.0079@seed2") == ("cosine-8x-lr0.0079", 2)
    assert seed_of("wsd-sqrt-4x") == ("wsd-sqrt-4x", 0)


def test_replicas_start_once_their_choice_is_settled_and_train_from_token_0():
    s = study()
    first = pending_with_seeds(s, 3, {}, checkpoints([]))
    for seed in (1, 2):
        recipe = first[f"recipe@seed{seed}"]
        assert recipe["seed"] == BASE.seed + seed and recipe["branch_from"] is None
        assert recipe["optimizer"] == first["recipe"]["optimizer"]
    # The grids are seed 0's alone, and no grid has chosen yet: no replica of a grid run, nor
    # of the constant trunk, whose LR its grid picks.
    assert not [n for n in first if "@seed" in n and not n.startswith("recipe")]
    assert pending_with_seeds(s, 1, {}, checkpoints([])) == s.pending({}, checkpoints([]))

    # The 1x grids settle (interior bests): their best LR's replicas start, schedule-free's and
    # the constant trunk's.
    finished = {name: history((1.0, 1.0)) for name in first if "@seed" not in name}
    for name, loss in (("cosine-1x-lr0.1", 0.5), ("linear-1x-lr0.1", 0.6), ("constant-lr0.2", 0.7)):
        finished[name] = history((1.0, loss))
    finished["constant-lr0.4"] = history((1.0, 0.8))  # its extension: 0.2 is interior
    grid = s.schedulefree_grid()
    finished[grid.run_name(grid.start[1])] = history((1.0, 0.4))
    finished["constant"] = history((1.0, 0.9), (2.0, 0.8))
    finished["constant@seed1"] = history((1.0, 0.9), (2.0, 0.8))
    asked = []
    second = pending_with_seeds(s, 3, finished, checkpoints(asked))
    for seed in (1, 2):
        for name in ("cosine-1x-lr0.1", "linear-1x-lr0.1"):
            replica = second[seeded(name, seed)]
            assert replica["seed"] == BASE.seed + seed
            assert replica["optimizer"]["lr"] == 0.1 and replica["budget"]["horizon"] == 1.0
        free = second[f"schedulefree@seed{seed}"]
        assert free["branch_from"] is None and free["budget"]["horizon"] == 2.0
        assert free["optimizer"]["lr"] == grid.start[1]
    trunk = second["constant@seed2"]  # at the LR the grid picked (not the recipe's), from 0
    assert trunk["seed"] == BASE.seed + 2 and trunk["branch_from"] is None
    assert trunk["optimizer"]["lr"] == 0.2 and trunk["budget"]["horizon"] == 2.0
    # Seed 1's trunk has finished: its WSD branches start from its own checkpoints.
    assert second["wsd-2x@seed1"]["branch_from"] == "/ckpt/constant@seed1/1.8"
    assert second["wsd-2x@seed1"]["optimizer"]["lr"] == 0.2
    assert second["wsd-2x@seed1"]["seed"] == BASE.seed + 1
    assert ("constant@seed1", 1.8) in asked and "wsd-2x@seed2" not in second
    # Nothing finished is pending again.
    finished |= {name: history((2.0, 0.7)) for name in second}
    assert not set(pending_with_seeds(s, 3, finished, checkpoints([]))) & set(finished)


def test_the_interval_is_students_t_as_scipy_computes_it():
    values = [1.10, 1.13, 1.08, 1.12]
    mean, half, n = interval(values)
    low, high = stats.t.interval(0.95, len(values) - 1, loc=mean, scale=stats.sem(values))
    assert n == 4 and mean == pytest.approx(sum(values) / 4)
    assert (mean - half, mean + half) == pytest.approx((low, high), rel=1e-12)
    assert interval([1.0, math.nan, 1.2])[2] == 2  # a missing replica is not a zero
    assert math.isnan(interval([1.0])[1])
    assert verdict(-0.01, 0.004) == "better" and verdict(0.01, 0.004) == "worse"
    assert verdict(-0.01, 0.02) == "within noise" and verdict(-0.01, math.nan) == "n/a"


def test_the_table_over_seeds_pairs_each_gap_by_seed():
    """The recipe is 0.01 better than the envelope on every seed although the seeds' spread
    (0.05) is five times that: paired, the gap is -0.01 ± 0 (better); constant's gap swings
    around 0 (within noise)."""
    s = TransferStudy(BASE, [1.0], ["recipe", "constant", "cosine"], 1.0, constant_lr="recipe")
    runs = {f"cosine-1x-lr{lr:g}": history((1.0, loss)) for lr, loss in ((0.05, 1.3), (0.2, 1.4))}
    base = [1.00, 1.05, 0.95]  # each seed's envelope: its start and data order set the level
    for seed, level in enumerate(base):
        runs[seeded("cosine-1x-lr0.1", seed)] = history((1.0, level))
        runs[seeded("recipe", seed)] = history((1.0, level - 0.01), key="val_loss_ema/0.04")
        runs[seeded("constant", seed)] = history((1.0, level + (0.02, -0.03, 0.01)[seed]))
    table = transfer_table(s, runs)
    assert table["seeds"] == 3
    rows = table["rows"]
    recipe = next(row for label, row in rows.items() if label.startswith("recipe"))["seeds"]["1"]
    assert recipe["losses"] == pytest.approx([0.99, 1.04, 0.94])
    assert recipe["gap"] == pytest.approx(-0.01) and recipe["gap_half_width"] == pytest.approx(0)
    assert recipe["half_width"] > 0.1 and recipe["verdict"] == "better"
    constant = rows["constant + EMA (best of bank)"]["seeds"]["1"]
    assert constant["verdict"] == "within noise"
    assert rows[ENVELOPE_ROW]["seeds"]["1"]["losses"] == pytest.approx(base)
    # The seed-0 table is what it was: replicas are not grid runs.
    assert rows["cosine envelope (last iterate)"]["loss"]["1"] == 1.0
    # The envelope with each run's best EMA may pick another LR, which has no replicas: it has
    # no cells over seeds.
    assert "seeds" not in rows["envelope with EMA (each run's best EMA)"]
    text = seeds_markdown(table)
    assert "## Over 3 seeds" in text
    # The cosine envelope, the only kind here, reads the envelope's very runs: its gap is 0 by
    # construction, the reference's, not a gap that chance could call either way.
    assert rows["cosine envelope (last iterate)"]["seeds"]["1"]["verdict"] == "the reference"
    verdicts = [c["verdict"] for r in rows.values() for c in r.get("seeds", {}).values()]
    judged = sum(v in ("better", "worse", "within noise") for v in verdicts)
    assert judged == 2 and f"{judged} gaps are judged, each at 95%" in text
    assert f"about {judged / 20:.1f} of them would read better or worse by chance" in text
    recipe_line = next(line for line in text.splitlines() if line.startswith("| recipe"))
    assert "(-0.0100 ± 0.0000, better)" in recipe_line
    assert "within noise" in next(line for line in text.splitlines() if "constant" in line)


def test_a_best_of_bank_row_reads_its_replicas_at_the_member_seed_0_chose():
    """Constant + EMA is scored by its bank's best member on seed 0; its replica is read at that
    member, not at whichever is best on its own evaluation (a selection no rival gets)."""
    s = TransferStudy(BASE, [1.0], ["constant", "cosine"], 1.0, constant_lr="recipe")

    def banked(raw: float, ema: float) -> list[Evaluation]:
        metrics = {"val_loss_raw": raw, "val_loss_ema/0.04": ema, "val_loss": min(raw, ema)}
        return [Evaluation.from_metrics({"chinchilla": 1.0, "tokens": 100, **metrics})]

    runs = {f"cosine-1x-lr{lr:g}": history((1.0, 1.3)) for lr in (0.05, 0.2)}
    for seed in range(2):
        runs[seeded("cosine-1x-lr0.1", seed)] = history((1.0, 1.2))
    runs["constant"] = banked(raw=1.10, ema=1.00)  # seed 0: the EMA is the best member
    runs["constant@seed1"] = banked(raw=0.90, ema=1.05)  # seed 1 alone would pick the raw
    cell = transfer_table(s, runs)["rows"]["constant + EMA (best of bank)"]["seeds"]["1"]
    assert cell["losses"] == pytest.approx([1.00, 1.05])


def test_seeds_without_an_envelope_still_give_means_and_no_verdict():
    """`--methods recipe,constant --seeds 2`: no envelope to pair with, so each row has its mean
    and interval, its gap NaN and no verdict; the table and its markdown are written."""
    s = TransferStudy(BASE, [1.0], ["recipe", "constant"], 1.0, constant_lr="recipe")
    runs = {}
    for seed, level in enumerate((1.0, 1.1)):
        runs[seeded("recipe", seed)] = history((1.0, level), key="val_loss_ema/0.04")
        runs[seeded("constant", seed)] = history((1.0, level + 0.01))
    table = transfer_table(s, runs)
    cell = table["rows"]["constant + EMA (best of bank)"]["seeds"]["1"]
    assert cell["mean"] == pytest.approx(1.06) and cell["n"] == 2
    assert math.isnan(cell["gap"]) and cell["verdict"] == "n/a"
    assert "## Over 2 seeds" in seeds_markdown(table)


def test_a_replayed_round_plans_its_replicas_again_and_runs_none_that_ended():
    """On resume a round is replayed from what finished before it: the replicas it planned are
    planned again, and those that ended in it are not pending."""
    s = study(["recipe", "constant"], constant_lr="recipe")
    first = pending_with_seeds(s, 2, {}, checkpoints([]))
    assert {"recipe@seed1", "constant@seed1"} <= set(first)
    replay = pending_with_seeds(s, 2, {}, checkpoints([]), frozenset({"recipe@seed1"}))
    assert "recipe@seed1" not in replay and replay["constant@seed1"] == first["constant@seed1"]


ONE_HORIZON = TransferStudy(BASE, [1.0], ["recipe", "cosine"], 1.0)


def _one_horizon_runs(recipe: list[float | None], envelope: list[float]) -> dict:
    """The runs of a 3-seed study at 1x: the recipe's and the envelope's loss on each seed
    (inf: the run diverged; None: the run is missing)."""
    runs = {f"cosine-1x-lr{lr:g}": history((1.0, loss)) for lr, loss in ((0.05, 1.3), (0.2, 1.4))}
    for seed in range(3):
        runs[seeded("cosine-1x-lr0.1", seed)] = history((1.0, envelope[seed]))
        if recipe[seed] is not None:
            runs[seeded("recipe", seed)] = history((1.0, recipe[seed]), key="val_loss_ema/0.04")
    return runs


def _one_horizon_study(recipe: list[float | None], envelope: list[float]) -> dict:
    return transfer_table(ONE_HORIZON, _one_horizon_runs(recipe, envelope))


def test_a_row_that_diverged_on_a_seed_reads_worse_whatever_its_other_seeds_say():
    """Dropping the diverged seed would leave two seeds 0.01 better than the envelope (a
    'better' row); a diverged run ranks last, as in the LR grids."""
    table = _one_horizon_study([0.99, 1.039, math.inf], [1.00, 1.05, 0.95])
    recipe = next(row for label, row in table["rows"].items() if label.startswith("recipe"))
    cell = recipe["seeds"]["1"]
    assert cell["losses"][2] == math.inf and cell["n"] == 2 and cell["diverged"] == 1
    assert cell["gap_n"] == 2 and cell["verdict"] == "worse: diverged on 1 seed"
    line = next(line for line in seeds_markdown(table).splitlines() if line.startswith("| recipe"))
    assert "[2 of 3 seeds, 1 diverged]" in line and "[2 pairs]" in line, line
    assert "better" not in line


def test_where_the_envelope_diverged_the_gap_counts_the_pairs_it_has():
    table = _one_horizon_study([0.99, 1.04, 0.94], [1.00, 1.05, math.inf])
    rows = table["rows"]
    recipe = next(row for label, row in rows.items() if label.startswith("recipe"))["seeds"]["1"]
    assert recipe["n"] == 3 and recipe["gap_n"] == 2 and recipe["envelope_diverged"] == 1
    assert recipe["gap"] == pytest.approx(-0.01)
    text = seeds_markdown(table)
    recipe_line = next(line for line in text.splitlines() if line.startswith("| recipe"))
    assert "[2 pairs, the envelope diverged on 1]" in recipe_line, recipe_line
    envelope_line = next(line for line in text.splitlines() if line.startswith(f"| {ENVELOPE_ROW}"))
    assert "(the reference)" in envelope_line and "1 diverged" in envelope_line, envelope_line


def test_one_seed_of_a_cell_has_no_interval_to_show():
    table = _one_horizon_study([0.99, None, None], [1.00, 1.05, 0.95])
    line = next(row for row in seeds_markdown(table).splitlines() if row.startswith("| recipe"))
    assert "0.9900, no interval [1 of 3 seeds] (-0.0100, no interval [1 pair], n/a)" in line
    assert "nan" not in line, line


def test_an_exact_tie_in_a_grid_picks_the_run_whose_replicas_exist():
    """The grid replicates its own choice, the lower LR on a tie; the envelope's seed cells
    come from that run whatever order the runs were read in."""
    s = TransferStudy(BASE, [1.0], ["recipe", "cosine"], 1.0)
    runs = {"cosine-1x-lr0.2": history((1.0, 1.0)), "cosine-1x-lr0.05": history((1.0, 1.3))}
    for seed, level in enumerate((1.0, 1.05, 0.95)):
        runs[seeded("cosine-1x-lr0.1", seed)] = history((1.0, level))
        runs[seeded("recipe", seed)] = history((1.0, level - 0.01), key="val_loss_ema/0.04")
    cell = transfer_table(s, runs)["rows"][ENVELOPE_ROW]["seeds"]["1"]
    assert cell["n"] == 3 and cell["losses"] == pytest.approx([1.0, 1.05, 0.95])


def test_without_an_envelope_a_diverged_seed_is_counted_but_no_gap_is_called():
    s = TransferStudy(BASE, [1.0], ["recipe", "constant"], 1.0, constant_lr="recipe")
    runs = {}
    for seed, level in enumerate((1.0, 1.1, math.inf)):
        runs[seeded("recipe", seed)] = history((1.0, level), key="val_loss_ema/0.04")
        runs[seeded("constant", seed)] = history((1.0, 1.0))
    table = transfer_table(s, runs)
    recipe = next(row for label, row in table["rows"].items() if label.startswith("recipe"))
    cell = recipe["seeds"]["1"]
    assert cell["diverged"] == 1 and cell["diverged_alone"] == 0 and cell["verdict"] == "n/a"
    line = next(row for row in seeds_markdown(table).splitlines() if row.startswith("| recipe"))
    assert "[2 of 3 seeds, 1 diverged] (n/a)" in line, line


def _diverged_marks(figure, legend_name: str) -> tuple[list[float], set[float]]:
    """The horizons the gap figure marks near its top edge for the row named `legend_name` in
    its legend, and the heights of its marks (in axes units)."""
    axis = figure.axes[0]
    legend = axis.get_legend()
    names = [text.get_text() for text in legend.get_texts()]
    assert legend_name in names, names
    color = legend.legend_handles[names.index(legend_name)].get_color()
    marks = [
        line
        for line in axis.get_lines()
        if line.get_transform() != axis.transData and line.get_color() == color
    ]
    return sorted(float(x) for line in marks for x in line.get_xdata()), {
        float(y) for line in marks for y in line.get_ydata()
    }


@pytest.mark.parametrize("seeds", [1, 3])
def test_a_row_that_diverged_on_every_seed_stays_in_the_gap_figure(seeds):
    """No finite gap to draw, yet the row a user might pick is named in the legend and its
    horizon is marked at the top edge, with one seed as with three. With one seed the run
    diverged as runs do: before its first evaluation, so it has none (no loss, not +inf)."""
    if seeds == 3:
        table = _one_horizon_study([math.inf] * 3, [1.00, 1.05, 0.95])
    else:
        s = TransferStudy(BASE, [1.0], ["recipe", "cosine"], 1.0)
        grid = ((0.05, 1.3), (0.1, 1.0), (0.2, 1.4))
        runs = {f"cosine-1x-lr{lr:g}": history((1.0, loss)) for lr, loss in grid}
        runs["recipe"] = history()
        table = transfer_table(s, runs)
    label = next(label for label in table["rows"] if label.startswith("recipe"))
    figure = gap_figure(table)
    try:
        # named in the legend as diverged, since it has no line to draw
        assert _diverged_marks(figure, f"{label} (diverged)")[0] == [1.0]
    finally:
        plt.close(figure)


def test_with_one_seed_a_run_that_diverged_before_a_horizon_is_marked_there_only():
    """The recipe evaluated at 1x, then diverged: its gap at 1x is drawn, 2x is marked; the
    cosine tuned for 1x never trained to 2x, so its missing 2x is not a divergence."""
    s = TransferStudy(BASE, [1.0, 2.0], ["recipe", "cosine"], 1.0)
    runs = {}
    for h in (1.0, 2.0):
        for lr, loss in ((0.05, 1.3), (0.1, 1.0), (0.2, 1.4)):
            runs[f"cosine-{h:g}x-lr{lr:g}"] = history(*((t, loss) for t in (1.0, 2.0) if t <= h))
    runs["recipe"] = history((1.0, 1.01), key="val_loss_ema/0.04")
    table = transfer_table(s, runs)
    label = next(label for label in table["rows"] if label.startswith("recipe"))
    assert table["rows"][label]["diverged"] == {"1": False, "2": True}
    assert not any(row["diverged"]["2"] for name, row in table["rows"].items() if name != label)
    figure = gap_figure(table)
    try:
        assert _diverged_marks(figure, label)[0] == [2.0]
    finally:
        plt.close(figure)


def test_rows_that_diverged_at_one_horizon_are_marked_in_lanes_of_their_own():
    """Two rows diverged on every seed at 2x: each is marked there, one above the other, and
    neither at 1x, where they have gaps."""
    s = TransferStudy(BASE, [1.0, 2.0], ["recipe", "constant", "cosine"], 1.0, constant_lr="recipe")
    runs = {}
    for h in (1.0, 2.0):
        for lr, loss in ((0.05, 1.3), (0.2, 1.4)):
            runs[f"cosine-{h:g}x-lr{lr:g}"] = history(*((t, loss) for t in (1.0, 2.0) if t <= h))
    for seed in range(3):
        runs[seeded("cosine-1x-lr0.1", seed)] = history((1.0, 1.0 + 0.02 * seed))
        runs[seeded("cosine-2x-lr0.1", seed)] = history((1.0, 1.0), (2.0, 0.9 + 0.02 * seed))
        diverged = ((1.0, 1.01 + 0.02 * seed), (2.0, math.inf))
        runs[seeded("recipe", seed)] = history(*diverged, key="val_loss_ema/0.04")
        runs[seeded("constant", seed)] = history(*diverged)
    table = transfer_table(s, runs)
    figure = gap_figure(table)
    try:
        marks = [
            _diverged_marks(figure, label)
            for label in table["rows"]
            if label.startswith(("recipe", "constant"))
        ]
    finally:
        plt.close(figure)
    assert [horizons for horizons, _ in marks] == [[2.0], [2.0]]
    heights = [height for _, height in marks]
    assert all(len(h) == 1 for h in heights) and heights[0] != heights[1], heights


def test_the_transfer_json_of_a_diverged_replica_is_strict_json(tmp_path):
    """A replica that diverged has an infinite loss in the table; transfer.json writes it as
    null, so that jq or a browser reads the file too; the markdown still counts it."""
    runs = _one_horizon_runs([0.99, 1.039, math.inf], [1.00, 1.05, 0.95])
    records = {name: RunRecord(runs[name], {}, f"round1/{name}") for name in runs}
    write_transfer_report(tmp_path, ONE_HORIZON, records, [])
    table = strict_loads((tmp_path / "transfer.json").read_text())
    recipe = next(row for label, row in table["rows"].items() if label.startswith("recipe"))
    assert recipe["seeds"]["1"]["losses"][2] is None and recipe["seeds"]["1"]["diverged"] == 1
    assert table["runs"]["recipe@seed2"]["losses"]["1"]["objective"] is None
    assert "[2 of 3 seeds, 1 diverged]" in (tmp_path / "transfer.md").read_text()
