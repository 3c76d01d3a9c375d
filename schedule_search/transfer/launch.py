"""How a transfer is launched: the command line's choices, or, when a transfer is being
resumed, those it was launched with (`transfer/launch.json`), and a refusal when the two would
change its runs."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from schedule_search.core.config import ConfigError
from schedule_search.store.experiment import Experiment, SweepSettings
from schedule_search.store.facts import read_facts
from schedule_search.train.config import check_workers
from schedule_search.transfer.plan import CONSTANT_LR, METHODS, constant_lr_of
from schedule_search.transfer.reuse import read_donor
from schedule_search.transfer.run import SHARED_HELD_OUT, build_study, transfer_base

__all__ = ["DEFAULT_MULTIPLES", "TransferLaunch", "plan_launch"]

DEFAULT_MULTIPLES = [8.0, 16.0, 32.0]


@dataclass(frozen=True)
class TransferLaunch:
    settings: SweepSettings  # the sweep's, with the transfer's workers and concurrency
    horizons: list[float]  # the sweep's horizon and the longer ones
    methods: list[str]
    resume: bool
    seeds: int = 1
    constant_lr: str = CONSTANT_LR[0]  # a resumed transfer's own rule
    reuse: Path | None = None  # an earlier transfer's folder whose ended runs are copied


def plan_launch(
    sweep: Experiment,
    to: list[float] | None,
    methods: list[str] | None,
    workers: int | None,
    concurrency: int | None,
    seeds: int | None = None,
    reuse: Path | None = None,
) -> TransferLaunch:
    """Resolve and check a transfer's launch before Ray starts: every first run's config is
    built, and a resumed transfer keeps what it was launched with unless a flag says
    otherwise (a flag that would change its runs, seeds included, is a ConfigError: a round
    replayed on resume must plan what it ran)."""
    settings = sweep.settings()
    launched = sweep.root / "transfer" / "launch.json"
    before = json.loads(launched.read_text()) if launched.exists() else {}
    workers = workers or before.get("workers")
    concurrency = concurrency or before.get("concurrency")
    if workers:
        settings = dataclasses.replace(settings, workers=workers)
    if concurrency:
        settings = dataclasses.replace(settings, concurrency=concurrency)
    base, _ = transfer_base(sweep, settings.workers)
    check_workers(base.sharding, settings.workers, f"{sweep.root} (the recipe's trial)")
    read_facts(sweep.root).check_beyond(to or [])
    targets = to or before.get("to") or DEFAULT_MULTIPLES
    horizons = sorted({base.budget.horizon, *targets})
    methods = methods or before.get("methods") or list(METHODS)
    constant_lr = constant_lr_of(launched)
    build_study(sweep, settings, horizons, methods, constant_lr)
    seeds = seeds or before.get("seeds", 1)
    if before.get("seeds", 1) > 1 and before.get("held_out") != SHARED_HELD_OUT:
        raise ConfigError(
            f"{launched.parent}: a transfer of {before['seeds']} seeds whose replicas were "
            "scored each on its seed's own held-out sample; runs made now share one, so the "
            "two cannot go in one table. Move that folder aside to run it again"
        )
    launched_as = (
        before.get("horizons"),
        set(before.get("methods", [])),
        before.get("workers"),
        before.get("seeds", 1),
    )
    if before and launched_as != (horizons, set(methods), settings.workers, seeds):
        raise ConfigError(
            f"{launched.parent}: a transfer to {','.join(f'{h:g}' for h in before['horizons'])}x "
            f"with {','.join(before['methods'])} on {before['workers']} workers and "
            f"{before.get('seeds', 1)} seed(s) is there; this "
            "one would change its runs. Move that folder aside to run another"
        )
    reuse = _donor_folder(reuse, before, launched, settings.workers)
    return TransferLaunch(settings, horizons, methods, launched.exists(), seeds, constant_lr, reuse)


def _donor_folder(flag: Path | None, before: dict, launched: Path, workers: int) -> Path | None:
    """The earlier transfer whose ended runs this one copies (`transfer.reuse`): the flag's, or
    on resume the one it was launched with; refused where its copies could not stand for this
    transfer's runs, or where the flag would change what a resumed round copies."""
    recorded = Path(before["reuse"]) if before.get("reuse") else None
    if before and flag is not None and flag.resolve() != recorded:
        was = f"with --reuse {recorded}" if recorded else "without --reuse"
        raise ConfigError(
            f"--reuse {flag.resolve()}: {launched.parent} was launched {was}; a resumed round "
            "copies what it copied. Move that folder aside to run another"
        )
    if flag is None and recorded is not None and not recorded.is_dir():
        print(f"note: {recorded} (--reuse) is gone: no more runs are copied from it", flush=True)
        return None
    folder = flag.resolve() if flag is not None else recorded
    if folder is None:
        return None
    if folder == launched.parent.resolve():
        raise ConfigError(f"--reuse {folder}: this transfer's own folder; move it aside first")
    read_donor(folder, workers, SHARED_HELD_OUT)  # refused here, in one line, or never
    return folder
