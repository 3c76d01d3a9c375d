"""Pack a stopped transfer and its sweep into one tarball that resumes on another machine.

The tinylm transfer study is about 500x Chinchilla of training, more than one sitting on a
2-core machine; this carries it from one to the next. Kept: every record (configs, metrics,
results, events), Tune's experiment state, and only the checkpoints still needed: the sweep
checkpoint the recipe continues from (a resumed study reads it to know the recipe continued),
the newest of every unfinished run, and every checkpoint of a trunk (the constant run, the
schedule-free grid) whose branches have not all finished. Left out: window logs
(`windows.jsonl`; no table or plot reads them) and every other checkpoint.

    python bench/pack_transfer.py default state.tar.gz      # after the transfer is stopped
    mkdir -p runs && tar xzf state.tar.gz -C runs             # elsewhere, at the same path
    schedule-search transfer default                          # resumes it
"""

from __future__ import annotations

import argparse
import json
import tarfile
from pathlib import Path

from schedule_search.transfer.plan import WSD


def needed_checkpoints(root: Path) -> set[Path]:
    """The checkpoint folders of experiment `root` that the rest of its transfer needs."""
    plan = json.loads((root / "transfer" / "plan.json").read_text())
    keep = {Path(plan["continued_from"]).resolve()} if plan.get("continued_from") else set()
    finished, train_dirs = set(), {}
    for trial in sorted((root / "transfer").glob("round*/trials/*")):
        config = json.loads((trial / "config.json").read_text())
        name = config["params"]["run"]
        train_dirs[name] = trial.parent.parent / "train" / config.get("train_run", "")
        if (trial / "result.json").exists():
            finished.add(name)
        elif config.get("train_run") and (folders := sorted(train_dirs[name].glob("checkpoint_*"))):
            keep.add(folders[-1].resolve())
    branches = {f"{prefix}-{h:g}x" for prefix in WSD for h in plan["horizons"]}
    trunks = []
    if not branches <= finished:
        trunks.append("constant")
    if "schedulefree" not in finished:
        trunks += [n for n in train_dirs if n.startswith("schedulefree-lr")]
    for name in trunks:
        if name in train_dirs:
            keep |= {f.resolve() for f in train_dirs[name].glob("checkpoint_*")}
    return keep


def pack(storage: Path, name: str, out: Path) -> set[Path]:
    keep = needed_checkpoints(storage / name)

    def wanted(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        path = (storage / info.name).resolve()
        if path.name == "windows.jsonl":
            return None
        inside = next((p for p in (path, *path.parents) if p.name.startswith("checkpoint_")), None)
        return None if inside is not None and inside not in keep else info

    with tarfile.open(out, "w:gz") as tar:
        tar.add(storage / name, arcname=name, filter=wanted)
    return keep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="the sweep whose transfer is packed (runs/<name>)")
    parser.add_argument("out", type=Path, help="the .tar.gz to write")
    parser.add_argument("--storage", type=Path, default=Path("runs"))
    args = parser.parse_args()
    keep = pack(args.storage, args.name, args.out)
    print(f"{args.out}: {args.out.stat().st_size / 1e6:.1f} MB, {len(keep)} checkpoints kept")


if __name__ == "__main__":
    main()
