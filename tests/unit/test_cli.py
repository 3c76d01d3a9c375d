"""The command line: every bad input is one line on stderr and exit code 2."""

import os
import subprocess
import sys

import pytest
from helpers import one_trial_sweep, write_config

from schedule_search.cli import main

BAD_TRAIN_CONFIGS = [
    ({"window": {"policy": "hours"}}, "window.policy"),
    ({"task": {"name": "linreg", "dimm": 3}}, "task.dimm: unknown key"),
    ({"schedule": {"kind": "cosine"}}, "schedule.horizon: required"),
    ({"optimizer": {"lr": -1}}, "optimizer.lr"),
    ({"optimizer": {"lr": "fast"}}, "optimizer.lr"),
    ({"ema": {"fractions": [0.1], "objective": 0.2}}, "ema.objective"),
    ({"budget": {"horizon": 0}}, "budget.horizon"),
    ({"window": {"microbatches": 0}}, "window.microbatches"),
    ({"task": {"dim": 3}}, "task.name"),
    ({"seed": -1}, "seed"),
    ({"surprise": 1}, "surprise: unknown key"),
    ({"sharding": "zero3"}, "sharding"),
    (
        {"sharding": "fsdp", "window": {"policy": "grad_norm"}},
        "window.policy: grad_norm does not run sharded",
    ),
    ({"sharding": "fsdp", "window": {"compression": "int8"}}, "window.compression"),
    ({"sharding": "fsdp"}, "sharding: fsdp shards across a run's workers and this one has 1"),
    ([1, 2, 3], "expected a mapping"),
    # Not numbers, though Python would read them as such: an infinite horizon passed every
    # bound and failed mid-run; `true` read as an LR of 1.0 and "2" as 2 micro-batches.
    ({"budget": {"horizon": float("inf")}}, "budget.horizon: Input should be a finite number"),
    ({"optimizer": {"lr": float("nan")}}, "optimizer.lr: Input should be a finite number"),
    ({"optimizer": {"lr": True}}, "optimizer.lr: Input should be a valid number"),
    ({"window": {"microbatches": "2"}}, "window.microbatches: Input should be a valid integer"),
    ({"window": {"overlap": "yes"}}, "window.overlap: Input should be a valid boolean"),
]


@pytest.mark.parametrize("content, message", BAD_TRAIN_CONFIGS)
def test_bad_train_config(tmp_path, capsys, content, message):
    path = write_config(tmp_path / "c.yaml", content)
    assert main(["train", str(path), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert message in err and str(path) in err
    assert err.count("\n") == 1
    assert not (tmp_path / "run").exists(), "nothing may be launched or written"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train"], "required: config"),
        (["train", "c.yaml", "--workers", "0"], "--workers"),
        (["train", "c.yaml", "--workers", "two"], "--workers"),
        (["train", "c.yaml", "--colour"], "unrecognized arguments"),
        (["fly"], "invalid choice"),
        ([], "required: verb"),
    ],
)
def test_bad_flags(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_unparsable_yaml_names_the_line(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("task: {name: linreg\nseed: [\n")
    assert main(["train", str(path)]) == 2
    assert f"{path}:" in capsys.readouterr().err


def test_console_entry_point_exit_code(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "schedule_search.cli", "train", str(tmp_path / "none.yaml")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "file not found" in result.stderr


def test_help_for_every_verb(capsys):
    from schedule_search.cli import build_parser

    verbs = build_parser()._subparsers._group_actions[0].choices
    assert {"train", "sweep", "resume", "status", "export", "transfer", "report"} <= set(verbs)
    for argv in (["--help"], *([verb, "--help"] for verb in verbs)):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 0, argv
        shown = capsys.readouterr().out
        assert shown.startswith(f"usage: schedule-search {' '.join(argv[:-1])}".rstrip()), argv
        assert "--help" in shown, argv


def test_importing_the_package_sets_no_ray_environment():
    """Ray's settings are made where a sweep starts or joins Ray, never at import: a cluster
    user's own settings (authentication above all) are left as they are."""
    from schedule_search.sweep.ray_env import (
        AUTH_VARIABLES,
        DRIVER_ENVIRONMENT,
        DRIVER_ONLY_ENVIRONMENT,
    )

    names = sorted([*DRIVER_ENVIRONMENT, *DRIVER_ONLY_ENVIRONMENT, *AUTH_VARIABLES])
    script = (
        "import os, schedule_search.cli, schedule_search.sweep.driver\n"
        "import schedule_search.transfer.run\n"
        f"print([n for n in {names!r} if n in os.environ])"
    )
    clean = {k: v for k, v in os.environ.items() if k not in names}
    shown = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=clean, check=True
    )
    assert shown.stdout.strip() == "[]"


def test_a_path_no_file_can_be_written_at_is_refused_before_any_work(tmp_path, capsys):
    """`export -o` naming a folder, or `train --run-dir` naming a file, were tracebacks at the
    write: after the export's reading, after the run's first checkpoint."""
    one_trial_sweep(tmp_path / "runs" / "w", warmup=0.1)
    storage = str(tmp_path / "runs")
    occupied = tmp_path / "occupied"
    occupied.write_text("a user's file\n")
    config = write_config(tmp_path / "c.yaml", {"task": {"name": "linreg", "dim": 8}})
    for argv, message in [
        (["export", "w", "--storage", storage, "-o", str(tmp_path)], "a folder; expected a file"),
        (["export", "w", "--storage", storage, "-o", str(occupied / "r.yaml")], "a file"),
        (["train", str(config), "--run-dir", str(occupied)], "is a file; expected a folder"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert occupied.read_text() == "a user's file\n"
    assert not (tmp_path / "runs" / "w" / "recipe.yaml").exists()
