"""Extract the 124M-parameter curves of Schaipp, Hägele et al. (github.com/fabian-sp/lr-scheduling,
MIT licence) that the forecast is checked on: cosine to 10% and to 0, and constant LR, at four
peak LRs and horizons of 15k-50k steps, on SlimPajama. Writes the committed extract
(tests/data/public_curves/schaipp_124m.json) from a clone of that repository:

    python bench/public_curves.py /path/to/lr-scheduling

Each run: its schedule in the forecast's terms (one unit of time = 10,000 steps; warmup 300
steps) and its validation loss every 1,000 steps up to its last log, 1,000 steps before its
end (a run resumed mid-way logged some steps twice: the last value is kept).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

UNIT = 10_000  # steps per unit of time
WARMUP = 300 / UNIT
PREFIXES = {
    "cos-10-124m": ("cosine", 0.1),
    "cos-zero-124m": ("cosine", 0.0),
    "stable-124m": ("constant", None),
}
OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "public_curves" / "schaipp_124m.json"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


def run_of(name: str, record: dict) -> dict | None:
    prefix = name.split("_slimpajama")[0]
    if prefix not in PREFIXES:
        return None
    kind, floor = PREFIXES[prefix]
    config, val = record["config"], record["history"]["val"]
    points = dict(zip(val["iter"], val["val_loss"], strict=True))  # a repeated step: the last
    steps = config["iterations"]
    kept = {i / UNIT: points[i] for i in sorted(points) if i % 1000 == 0 and i > 0}
    if len(kept) < 0.9 * (steps // 1000 - 1):  # a history with gaps (resumed, partly logged)
        return None
    if list(kept.values())[-1] > min(kept.values()) + 0.5:  # diverged (lr 0.005)
        return None
    schedule = {"kind": kind, "warmup": WARMUP}
    if kind == "cosine":
        schedule |= {"horizon": steps / UNIT, "floor": floor}
    return {"name": name, "lr": config["lr"], "steps": steps, "schedule": schedule, "points": kept}


def main(repo: Path) -> None:
    commit = git(repo, "rev-parse", "HEAD").strip()
    runs = []
    for name in git(repo, "ls-tree", "--name-only", "HEAD", "data/").split():
        if not Path(name).stem.startswith(tuple(PREFIXES)):
            continue  # not read at all: the repository holds many other runs
        record = json.loads(git(repo, "show", f"HEAD:{name}"))
        run = run_of(Path(name).stem, record)
        if run is not None:
            runs.append(run)
    licence = git(repo, "show", "HEAD:LICENSE")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "source": "https://github.com/fabian-sp/lr-scheduling",
                "commit": commit,
                "licence": licence,
                "unit_steps": UNIT,
                "runs": runs,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"{len(runs)} runs -> {OUT}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
