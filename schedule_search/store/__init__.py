"""The runs folder, read and written without Ray: an experiment's layout and settings (with
the format number it was written in), the facts a sweep measured, trial records and their
rows and ranking, and the lock that keeps one driver per experiment. `status`, `export` and
`report` need nothing above this."""
