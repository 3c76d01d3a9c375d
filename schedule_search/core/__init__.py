"""Pieces every run shares and nothing above them: the token clock, LR schedules, the EMA
bank, windowed accumulation, the optimizer, checkpoints and atomic files, config parsing,
signals and the states of a run."""
