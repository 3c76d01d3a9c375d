"""The transfer study: the tuned recipe continued to longer horizons against references tuned
per horizon (plan: which runs; run: rounds of them under Ray Tune; launch: how it is
launched or resumed; lr_grid: grids that extend until their optimum is interior; scores:
how a run is scored at a horizon)."""
