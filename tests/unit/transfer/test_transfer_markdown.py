"""transfer.md's one-seed table, read as a user reads it."""

from test_transfer_plan import BASE, history

from schedule_search.report.transfer import write_transfer_report
from schedule_search.transfer.plan import TransferStudy
from schedule_search.transfer.run import RunRecord


def test_the_one_seed_table_tells_a_diverged_cell_from_one_never_run(tmp_path):
    """The recipe diverged before 2x; the cosine grid of 2x was never run (its records are
    lost): one cell reads 'diverged', the other 'n/a'."""
    s = TransferStudy(BASE, [1.0, 2.0], ["recipe", "cosine"], 1.0)
    configs = {"recipe": s.recipe()}
    runs = {"recipe": history((1.0, 0.97), key="val_loss_ema/0.04")}
    spec = s.grid("cosine", 1.0, runs)
    for lr, loss in zip(spec.start, (1.3, 1.0, 1.4), strict=True):
        runs[spec.run_name(lr)] = history((1.0, loss))
        configs[spec.run_name(lr)] = s.grid_run(spec, lr)
    records = {name: RunRecord(runs[name], configs[name], f"round1/{name}") for name in runs}
    (tmp_path / "transfer").mkdir()
    write_transfer_report(tmp_path / "transfer", s, records, [])
    lines = (tmp_path / "transfer" / "transfer.md").read_text().splitlines()
    recipe = next(line for line in lines if line.startswith("| recipe"))
    envelope = next(line for line in lines if line.startswith("| cosine envelope (last"))
    assert recipe.split(" | ")[1:3] == ["0.9700 (-0.0300 / -0.0300)", "diverged"], recipe
    assert envelope.split(" | ")[2] == "n/a", envelope
    # How each row ran is said under the table, not only in transfer.json.
    assert "- recipe (anytime + EMA): EMA fraction 0.04" in lines, lines
