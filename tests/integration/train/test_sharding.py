"""A sharded (fsdp) training run and a replicated one of the same config, each on two real
gloo ranks, end in the same checkpoint bit for bit: parameters, AdamW state, every EMA of the
bank (averaged over local shards), every held-out loss (evaluated with each EMA swapped into
the shards) and the token clock. The sharded checkpoint is the replicated format: a sharded
run resumed replicated from its first checkpoint, and a replicated one resumed sharded, end
where the straight runs end; on one rank, with the tokens per step kept, it keeps the clock.
Schedule-free AdamW's evaluation switch (its averaged
weights swapped into the shards and back) is exact sharded too."""

import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers import run_ranks

from schedule_search.core import checkpoint as ckpt
from schedule_search.core.config import parse
from schedule_search.train.config import TrainConfig
from schedule_search.train.loop import train
from schedule_search.train.session import LocalSession


def config(sharding: str, policy: str, optimizer: str, microbatches: int = 3) -> TrainConfig:
    tiny = {"d_model": 32, "n_layer": 2, "n_head": 2, "context": 32, "batch": 4}
    data = {
        "task": {"name": "tinylm", **tiny, "max_bytes": 200_000, "eval_batches": 2},
        "window": {"policy": policy, "microbatches": microbatches, "tokens": 384},
        "budget": {"horizon": 0.03, "eval_at": [0.015]},
        "ema": {"fractions": [0.0, 0.04, 0.16], "objective": 0.04},
        "optimizer": {"name": optimizer, "lr": 0.01},
        "sharding": sharding,
    }
    return parse(TrainConfig, data, "test")


CASES = [("microbatches", "adamw"), ("tokens", "schedulefree_adamw")]


SHARDINGS = ("replicated", "fsdp")


def train_every_case(rank: int, world: int, root: str) -> None:
    """Both cases, replicated then sharded, then each resumed from the other's first
    checkpoint, in one process group."""
    for policy, optimizer in CASES:
        for sharding in SHARDINGS:
            run = config(sharding, policy, optimizer)
            result = train(run, LocalSession(Path(root) / policy / sharding, run.checkpoint.keep))
            assert result.status == "completed"
        for saved, resumed in (SHARDINGS, reversed(SHARDINGS)):
            crossed = Path(root) / policy / f"{saved}-then-{resumed}"
            if rank == 0:
                first = ckpt.checkpoint_folders(Path(root) / policy / saved / "checkpoints")[0]
                shutil.copytree(first, crossed / "checkpoints" / first.name)
            dist.barrier()
            run = config(resumed, policy, optimizer)
            assert train(run, LocalSession(crossed, run.checkpoint.keep)).status == "completed"


def assert_same_checkpoint(a: dict, b: dict) -> None:
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
    assert a["optimizer"]["state"].keys() == b["optimizer"]["state"].keys()
    for index, slot in a["optimizer"]["state"].items():
        assert slot.keys() == b["optimizer"]["state"][index].keys()
        assert all(torch.equal(v, b["optimizer"]["state"][index][k]) for k, v in slot.items())
    for frac, averages in a["ema"]["averages"].items():
        assert all(
            torch.equal(x, y) for x, y in zip(averages, b["ema"]["averages"][frac], strict=True)
        )

    def losses(state: dict) -> list[list[float]]:
        history = state["progress"]["history"]
        return [[v for k, v in row.items() if k.startswith("val_loss")] for row in history]

    assert losses(a) == losses(b) and len(losses(a)) == 2
    assert a["window"] == b["window"] and a["window"]["windows"] > 10


@pytest.mark.slow
@pytest.mark.cost(10)
def test_sharded_runs_end_in_the_replicated_runs_checkpoints(tmp_path):
    """`microbatches` windows with AdamW (FSDP gathers per module), `tokens` windows with
    schedule-free AdamW (the gathered weights held through each window)."""
    run_ranks(train_every_case, 2, str(tmp_path))
    for policy, _ in CASES:

        def final(run: str, policy: str = policy) -> dict:
            return ckpt.load_latest(tmp_path / policy / run / "checkpoints")[1]

        assert_same_checkpoint(final("replicated"), final("fsdp"))
        # Resumed in the other sharding from the first checkpoint: where the straight run ends.
        assert_same_checkpoint(final("fsdp-then-replicated"), final("replicated"))
        assert_same_checkpoint(final("replicated-then-fsdp"), final("fsdp"))
        events = (tmp_path / policy / "replicated-then-fsdp" / "events.jsonl").read_text()
        assert '"resumed"' in events
    # One rank with the window's 6 micro-batches trains on the data the 2 ranks x 3 trained on
    # (one stream, `tasks.protocol.stream_generator`): it ends where they end, but for the
    # order in which the window's gradients were summed.
    alone = config("replicated", "microbatches", "adamw", microbatches=6)
    train(alone, LocalSession(tmp_path / "one-rank", alone.checkpoint.keep))
    one = ckpt.load_latest(tmp_path / "one-rank" / "checkpoints")[1]
    two = ckpt.load_latest(tmp_path / "microbatches" / "replicated" / "checkpoints")[1]
    assert one["window"]["windows"] == two["window"]["windows"] > 10
    worst = max((one["model"][k] - two["model"][k]).abs().max() for k in one["model"])
    assert worst < 1e-5, worst
