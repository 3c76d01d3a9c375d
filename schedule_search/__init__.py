"""schedule-search: tune horizon-free LR schedules, weight averaging and time windows once,
prove them on longer horizons, and export the recipe for your own training loop.

The package, by what each part owns: `core` (token clock, schedules, EMA bank, windows,
optimizer, checkpoints, files, config parsing), `tasks` (what is trained), `train` (one run),
`store` (the experiment folder, read and written without Ray), `recipe` (the tuned recipe
in a user's own loop, and its export), `sweep` (the search with Ray Tune and
Optuna), `transfer` (the recipe at longer horizons against references), `report` (tables and
plots), `cli` and `commands` (the command line).
"""

__version__ = "0.1.0"
