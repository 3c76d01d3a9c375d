"""The search: a space of training configs, Ray Tune + Optuna over core-trainer trials, and the
experiment folder every verb reads without Ray."""
