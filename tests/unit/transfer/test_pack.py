"""`pack_transfer` carries a stopped transfer to another machine: every record, of the
checkpoints only those the rest of the study needs, and never the local Ray's token."""

import ast
import json
import tarfile
from pathlib import Path

import schedule_search
from schedule_search.train.evaluation import Evaluation
from schedule_search.transfer.pack import LEFT_OUT, pack_transfer


def trial(rnd: Path, trial_id: str, run: str, checkpoints: list[int], finished: bool) -> None:
    folder = rnd / "trials" / trial_id
    folder.mkdir(parents=True)
    train_run = f"run-{trial_id}"
    config = {"params": {"run": run}, "train_run": train_run, "config": {}}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "metrics.json").write_text("[]")
    (folder / "windows.jsonl").write_text("{}\n")
    if finished:
        (folder / "result.json").write_text('{"state": "completed"}')
    for tokens in checkpoints:
        state(rnd / "train" / train_run, tokens)


def state(train_dir: Path, tokens: int) -> Path:
    path = train_dir / f"checkpoint_{tokens:015d}" / "state.pt"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x")
    return path.parent


def build(tmp_path: Path, branches_finished: bool, methods: list[str] | None = None) -> None:
    root = tmp_path / "runs" / "s"
    start = state(root / "train" / "run-sweep", 40)
    state(root / "train" / "run-sweep", 20)
    (root / "transfer").mkdir()
    (root / "ray_token").write_text("secret")  # a killed transfer's local Ray left it
    plan = {"continued_from": str(start), "horizons": [1.0, 2.0]}
    if methods is not None:
        plan["methods"] = methods
    (root / "transfer" / "launch.json").write_text(json.dumps(plan))
    first, second = root / "transfer" / "round1", root / "transfer" / "round2"
    trial(first, "a", "constant", [10, 20, 30], finished=True)
    trial(first, "b", "cosine-1x-lr0.1", [10, 20], finished=True)
    trial(second, "c", "cosine-2x-lr0.1", [10, 20], finished=False)
    trial(first, "f", "schedulefree-lr0.1", [5], finished=True)
    trial(first, "k", "constant-lr0.1", [3, 4], finished=True)  # the trunk's grid
    trial(second, "g", "schedulefree", [], finished=branches_finished)
    for i, h in enumerate((1, 2)):
        trial(second, f"w{i}", f"wsd-{h}x", [], finished=True)
        trial(second, f"q{i}", f"wsd-sqrt-{h}x", [], finished=branches_finished)


def packed(tmp_path: Path) -> list[str]:
    out = tmp_path / "state.tar.gz"
    pack_transfer(tmp_path / "runs", "s", out)
    with tarfile.open(out) as tar:
        return tar.getnames()


def checkpoints(names: list[str]) -> set[str]:
    """'<train run>@<tokens>' of every checkpoint packed."""
    return {
        f"{n.split('/')[-3]}@{int(n.split('/')[-2].removeprefix('checkpoint_'))}"
        for n in names
        if n.endswith("/state.pt")
    }


def test_only_the_checkpoints_the_rest_of_the_study_needs_are_packed(tmp_path):
    build(tmp_path / "open", branches_finished=False)
    names = packed(tmp_path / "open")
    # The recipe's start, the unfinished runs' newest, the trunks whose branches are open, and
    # the grids whose winner is to be continued or branched from.
    assert checkpoints(names) == {
        "run-k@3",
        "run-k@4",
        "run-sweep@40",
        "run-c@20",
        "run-a@10",
        "run-a@20",
        "run-a@30",
        "run-f@5",
    }
    assert not any(n.endswith("windows.jsonl") for n in names)
    assert "s/ray_token" not in names
    for record in ("config.json", "metrics.json", "result.json"):
        assert f"s/transfer/round1/trials/b/{record}" in names
    assert "s/transfer/launch.json" in names

    # Once every branch has finished, the trunks' checkpoints are left behind.
    build(tmp_path / "closed", branches_finished=True)
    names = packed(tmp_path / "closed")
    assert checkpoints(names) == {"run-sweep@40", "run-c@20"}
    # A study without WSD branches off nothing: once constant + EMA has been continued, its
    # grid's checkpoints are left behind whatever else is open.
    build(tmp_path / "no-wsd", branches_finished=False, methods=["constant", "schedulefree"])
    assert not {c for c in checkpoints(packed(tmp_path / "no-wsd")) if c.startswith("run-k@")}


def test_the_token_left_out_is_the_file_the_local_ray_writes():
    """The pack names the token file itself (the module that does imports Ray): read that
    module's `TOKEN_FILE` from its source, without importing it."""
    ray_env = Path(schedule_search.__file__).parent / "sweep" / "ray_env.py"
    (value,) = [
        node.value.value
        for node in ast.parse(ray_env.read_text()).body
        if isinstance(node, ast.Assign)
        and [getattr(t, "id", None) for t in node.targets] == ["TOKEN_FILE"]
        and isinstance(node.value, ast.Constant)
    ]
    assert value in LEFT_OUT


def trunk(root: Path, checkpoints: list[int], finished: bool, branches_done: list[str]) -> Path:
    """A study to 2x whose constant trunk (1x = 10 tokens) has `checkpoints`, and whose WSD
    branches `branches_done` have finished."""
    (root / "transfer").mkdir(parents=True)
    plan = {"continued_from": None, "horizons": [1.0, 2.0]}
    (root / "transfer" / "launch.json").write_text(json.dumps(plan))
    rnd = root / "transfer" / "round1"
    trial(rnd, "a", "constant", checkpoints, finished=finished)
    folder = rnd / "trials" / "a"
    config = {"params": {"run": "constant"}, "train_run": "run-a"}
    config["config"] = {"budget": {"tokens_per_param": 10.0}}
    (folder / "config.json").write_text(json.dumps(config))
    evaluated = Evaluation(tokens=10, chinchilla=1.0, val_loss=1.0, n_params=1)
    (folder / "metrics.json").write_text(json.dumps([evaluated.to_metrics()]))
    for i, name in enumerate(branches_done):
        trial(rnd, f"b{i}", name, [], finished=True)
    return root


def test_of_a_trunk_only_its_open_branches_starts_are_packed(tmp_path):
    """The branches start at 0.9x and 1.8x (WSD, last 10%) and 0.8x and 1.6x (1 - sqrt, last
    20%): of 1x = 10 tokens, the checkpoints at or after 9, 18, 8 and 16 tokens."""
    every = [5, 8, 9, 10, 16, 17, 18, 20]
    trunk(tmp_path / "open" / "runs" / "s", every, finished=True, branches_done=[])
    assert checkpoints(packed(tmp_path / "open")) == {f"run-a@{t}" for t in (8, 9, 16, 18)}
    done = ["wsd-1x", "wsd-sqrt-1x"]
    trunk(tmp_path / "half" / "runs" / "s", every, finished=True, branches_done=done)
    assert checkpoints(packed(tmp_path / "half")) == {"run-a@16", "run-a@18"}
    # A trunk still training: what it has passed, and its newest to go on from.
    trunk(tmp_path / "going" / "runs" / "s", every[:6], finished=False, branches_done=[])
    assert checkpoints(packed(tmp_path / "going")) == {f"run-a@{t}" for t in (8, 9, 16, 17)}
