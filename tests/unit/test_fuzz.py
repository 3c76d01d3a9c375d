"""Fuzzed inputs: whatever the space, recipe or command line, the user sees one line and exit
code 2 (or a valid result), never a traceback."""

import contextlib
import io
import tempfile
from pathlib import Path

import yaml
from helpers import GOOD_RECIPE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedule_search.cli import main
from schedule_search.core.config import ConfigError
from schedule_search.recipe import load_recipe
from schedule_search.sweep.space import load_space

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(
        [
            "poly",
            "cosine",
            "linreg",
            "adamw",
            "microbatches",
            "choice",
            "uniform",
            "loguniform",
            "int",
            "seconds",
            "",
            "x:y",
            "1e-3",
        ]
    ),
)
keys = st.sampled_from(
    [
        "name",
        "samples",
        "seed",
        "scheduler",
        "base",
        "params",
        "points_to_evaluate",
        "objectives",
        "task",
        "optimizer",
        "schedule",
        "ema",
        "window",
        "budget",
        "lr",
        "kind",
        "type",
        "low",
        "high",
        "values",
        "optimizer.lr",
        "schedule.gamma",
        "window.microbatches",
        "dim",
        "fractions",
        "objective",
        "horizon",
        "format",
        "n_params",
        "tokens_per_param",
        "tokens_per_reference_step",
        "unknown",
    ]
)
trees = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=5)),
    max_leaves=20,
)

#: The recipe fuzzer edits a recipe that loads (random dictionaries fail at `format`).
RECIPE_PATHS = [(k,) for k in GOOD_RECIPE] + [
    (k, inner) for k, v in GOOD_RECIPE.items() if isinstance(v, dict) for inner in v
]
REMOVE = object()


def edited(edits: list[tuple[tuple[str, ...], object]]) -> dict:
    recipe = yaml.safe_load(yaml.safe_dump(GOOD_RECIPE))
    for path, value in edits:
        parent = recipe
        for key in path[:-1]:
            parent = parent.setdefault(key, {}) if isinstance(parent, dict) else {}
        if not isinstance(parent, dict):
            continue
        if value is REMOVE:
            parent.pop(path[-1], None)
        else:
            parent[path[-1]] = value
    return recipe


recipes = st.builds(
    edited,
    st.lists(
        st.tuples(st.sampled_from(RECIPE_PATHS), st.one_of(st.just(REMOVE), trees)),
        min_size=1,
        max_size=3,
    ),
)

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_loader(loader, data) -> str | None:
    """Load `data` from a file; a refusal is one line naming the file. Returns the key it was
    refused at (the message's first field after the file), or None if it loaded."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "input.yaml"
        path.write_text(yaml.safe_dump(data))
        try:
            loader(path)
        except ConfigError as err:
            assert "\n" not in str(err) and str(err).startswith(str(path))
            return str(err).removeprefix(f"{path}: ").split(":")[0]
    return None


@FUZZ
@given(st.dictionaries(keys, trees, max_size=6))
def test_space_loader_fuzz(data):
    if isinstance(data.get("base"), dict) and isinstance(data["base"].get("task"), dict):
        data["base"]["task"].pop("data", None)  # no reads of arbitrary paths
    check_loader(load_space, data)


@FUZZ
@given(st.one_of(trees, st.dictionaries(keys, trees, max_size=8), recipes))
def test_recipe_loader_fuzz(data):
    check_loader(load_recipe, data)


@FUZZ
@given(st.binary(max_size=200))
def test_loaders_on_arbitrary_bytes(raw):
    for loader in (load_space, load_recipe):
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "input.yaml"
            path.write_bytes(raw)
            try:
                loader(path)
            except ConfigError as err:
                assert "\n" not in str(err)


tokens = st.sampled_from(
    [
        "--samples",
        "--workers",
        "--concurrency",
        "--horizon",
        "--seed",
        "--name",
        "--storage",
        "--address",
        "--gpus-per-worker",
        "--to",
        "--methods",
        "--max-slowdown",
        "-o",
        "--run-dir",
        "0",
        "-1",
        "2",
        "1.5",
        "nan",
        "inf",
        "x",
        "8,16",
        "cosine,wsd",
        "recipe,nope",
        "",
        "a b",
        "../up",
        "missing.yaml",
    ]
) | st.text(max_size=8)


@FUZZ
@given(
    st.sampled_from(["sweep", "resume", "status", "export", "transfer", "train", "bogus"]),
    st.lists(tokens, max_size=6),
)
def test_cli_fuzz(verb, args):
    with tempfile.TemporaryDirectory() as storage:
        argv = [verb, *args]
        if verb in ("sweep", "train"):
            argv.insert(1, str(Path(storage) / "missing.yaml"))
        if verb not in ("train", "bogus"):
            argv += ["--storage", storage]
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(argv)
            except SystemExit as done:  # --help
                code = done.code
        err = stderr.getvalue()
        assert code in (0, 2), (argv, code, err)
        if code == 2:
            assert len(err.splitlines()) == 1 and err.endswith("\n"), (argv, err)
        assert not any(Path(storage).iterdir()), "nothing may be written"


def failing_keys(loader, inputs: st.SearchStrategy) -> set[str]:
    """The keys (the first field of the one-line message) at which `loader` refused inputs."""
    failed_at: set[str | None] = set()

    @FUZZ
    @given(inputs)
    def run(data):
        failed_at.add(check_loader(loader, data))

    run()
    return failed_at - {None}


def test_fuzz_strategies_reach_many_error_paths():
    """The space and recipe fuzzers above test something only if their inputs get past the
    first check: their strategies' inputs fail at many different keys of a space and of a
    recipe, not all at "not a mapping" (the command-line and raw-bytes fuzzers are not
    measured here)."""
    for loader, inputs in (
        (load_space, st.dictionaries(keys, trees, max_size=6)),
        (load_recipe, recipes),
    ):
        failed_at = failing_keys(loader, inputs)
        assert len(failed_at) >= 5, (loader.__name__, sorted(failed_at))
