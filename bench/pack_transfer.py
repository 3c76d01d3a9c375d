"""Pack a stopped transfer and its sweep into one tarball that resumes on another machine
(`schedule_search.transfer.pack` says what is kept and what is left out).

    python bench/pack_transfer.py default state.tar.gz      # after the transfer is stopped
    mkdir -p runs && tar xzf state.tar.gz -C runs             # elsewhere, at the same path
    schedule-search transfer default                          # resumes it
"""

from __future__ import annotations

import argparse
from pathlib import Path

from schedule_search.transfer.pack import pack_transfer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="the sweep whose transfer is packed (runs/<name>)")
    parser.add_argument("out", type=Path, help="the .tar.gz to write")
    parser.add_argument("--storage", type=Path, default=Path("runs"))
    args = parser.parse_args()
    keep = pack_transfer(args.storage, args.name, args.out)
    print(f"{args.out}: {args.out.stat().st_size / 1e6:.1f} MB, {len(keep)} checkpoints kept")


if __name__ == "__main__":
    main()
