"""A stopped transfer and its sweep packed into one tarball that resumes on another machine.

The tinylm transfer study is about 500x Chinchilla of training, more than one sitting on a
small machine; this carries it from one to the next. Kept: every record (configs, metrics,
results, events), Tune's experiment state, and only the checkpoints still needed: the sweep
checkpoint the recipe continues from (a resumed study reads it to know the recipe continued),
the newest of every unfinished run, of each seed's constant trunk the checkpoint every WSD
branch not yet finished starts from (the first at or after its branch point, as the plan
looks it up; every checkpoint of a trunk that has not evaluated yet), every checkpoint of
the schedule-free grid while its continuation has not finished, and of the constant grid
while its winner's continuation or a WSD branch has not. Left out: window logs
(`windows.jsonl`; no table or plot reads them), every other checkpoint, and the local Ray's
authentication token (`ray_token`, left behind by a killed sweep or transfer): a secret of a
Ray that no longer runs, and of no use elsewhere.

The tarball holds the experiment folder under its own name: unpacked into the storage folder
of another machine at the same path, `schedule-search transfer NAME` resumes it there.

This module imports no Ray: it only reads the files a transfer left.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from schedule_search.core import checkpoint as ckpt
from schedule_search.core.config import parse
from schedule_search.train.config import TrainConfig
from schedule_search.train.evaluation import Evaluation
from schedule_search.transfer.plan import WSD
from schedule_search.transfer.seeds import seeded

__all__ = ["LEFT_OUT", "needed_checkpoints", "pack_transfer"]

#: File names never packed, wherever they lie: window logs, and the local Ray's token (the
#: name `schedule_search.sweep.ray_env.TOKEN_FILE` gives it; not imported, it imports Ray).
LEFT_OUT = frozenset({"windows.jsonl", "ray_token"})
CHECKPOINT_PREFIX = "checkpoint_"


def needed_checkpoints(root: Path) -> set[Path]:
    """The checkpoint folders (resolved) of the experiment at `root` that the rest of its
    transfer needs: the recipe's start, the newest of each unfinished run, every checkpoint of
    a trunk whose branches have not all finished, and every checkpoint of the grids picked at
    the sweep's horizon while their winner is to be continued or branched from."""
    launched = json.loads((root / "transfer" / "launch.json").read_text())
    keep = {Path(launched["continued_from"]).resolve()} if launched.get("continued_from") else set()
    finished: set[str] = set()
    train_dirs: dict[str, Path] = {}
    trials: dict[str, Path] = {}
    for trial in sorted((root / "transfer").glob("round*/trials/*")):
        config = json.loads((trial / "config.json").read_text())
        name = config["params"]["run"]
        train_dirs[name] = trial.parent.parent / "train" / config.get("train_run", "")
        trials[name] = trial
        if (trial / "result.json").exists():
            finished.add(name)
        elif config.get("train_run") and (
            folders := sorted(train_dirs[name].glob(f"{CHECKPOINT_PREFIX}*"))
        ):
            keep.add(folders[-1].resolve())
    for seed in range(launched.get("seeds", 1)):  # each seed's WSD branches have a trunk
        trunk = seeded("constant", seed)
        points = [
            (1 - share) * h
            for prefix, (share, _, _) in WSD.items()
            for h in launched["horizons"]
            if seeded(f"{prefix}-{h:g}x", seed) not in finished
        ]
        if points and trunk in train_dirs:
            keep |= _branch_starts(trials[trunk], train_dirs[trunk], points)
    # A grid picked at the sweep's horizon: its winner is continued, and the constant grid's
    # winner is seed 0's trunk of the branches that start before that horizon.
    sweep_horizon = min(launched["horizons"])
    unbranched = "wsd" in launched.get("methods", ["wsd"]) and any(
        f"{prefix}-{h:g}x" not in finished
        for prefix, (share, _, _) in WSD.items()
        for h in launched["horizons"]
        if (1 - share) * h <= sweep_horizon + 1e-9
    )
    for grid, needed in (
        ("schedulefree", "schedulefree" not in finished),
        ("constant", "constant" not in finished or unbranched),
    ):
        if needed:
            for name in (n for n in train_dirs if n.startswith(f"{grid}-lr")):
                keep |= {f.resolve() for f in train_dirs[name].glob(f"{CHECKPOINT_PREFIX}*")}
    return keep


def _branch_starts(trial: Path, train_dir: Path, points: list[float]) -> set[Path]:
    """The checkpoints of the trunk `trial` (trained in `train_dir`) that branches at
    `points` (Chinchilla multiples) start from: for each, the first at or after it, the
    lookup `transfer.run` makes. Before its first evaluation the trunk's token clock is not
    recorded: all its checkpoints."""
    folders = ckpt.checkpoint_folders(train_dir)  # as transfer.run looks them up
    evaluations = json.loads((trial / "metrics.json").read_text())
    if not evaluations:
        return {f.resolve() for f in folders}
    config = json.loads((trial / "config.json").read_text())["config"]
    per_param = parse(TrainConfig, config, str(trial / "config.json")).budget.tokens_per_param
    clock = Evaluation.from_metrics(evaluations[-1]).token_clock(per_param)
    keep = set()
    for point in points:
        tokens = clock.tokens(point)
        start = next((f for f in folders if _tokens_of(f) >= tokens), None)
        if start is not None:  # a point the trunk has not reached: made when it gets there
            keep.add(start.resolve())
    return keep


def _tokens_of(folder: Path) -> int:
    return int(folder.name.removeprefix(ckpt.PREFIX))


def pack_transfer(storage: Path, name: str, out: Path) -> set[Path]:
    """Write `out` (a .tar.gz) holding the experiment `storage`/`name` under `name/`, less
    what the rest of its transfer does not need (see the module's docstring); return the
    checkpoint folders kept. The transfer must be stopped: a running one changes under it."""
    keep = needed_checkpoints(storage / name)

    def wanted(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        path = (storage / info.name).resolve()
        if Path(info.name).name in LEFT_OUT:
            return None
        inside = next(
            (p for p in (path, *path.parents) if p.name.startswith(CHECKPOINT_PREFIX)), None
        )
        return None if inside is not None and inside not in keep else info

    with tarfile.open(out, "w:gz") as tar:
        tar.add(storage / name, arcname=name, filter=wanted)
    return keep
